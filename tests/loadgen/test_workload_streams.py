"""The streams ``bench serve`` and ``simulate`` share, where vllm bench defines them: ShareGPT
files and the ramp-up arrival process, checked against vllm bench's own procedure."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from experiments.simconfig import config_dict_from_args
from workload.arrivals import ramp_up_rates, ramp_up_send_times
from workload.build import build_workload
from workload.config import WorkloadConfig
from workload.errors import WorkloadError


def sharegpt_file(path: Path, n: int = 30) -> Path:
    entries = [{"id": i, "conversations": [
        {"from": "human", "value": "word " * (1 + (7 * i) % 40)},
        {"from": "gpt", "value": "reply " * (1 + (5 * i) % 23)}]} for i in range(n)]
    entries.insert(3, {"id": "short", "conversations": [{"from": "human", "value": "hi"}]})
    path.write_text(json.dumps(entries))
    return path


def vllm_sharegpt(path: Path, tokenizer_dir: Path, n: int, seed: int,
                  output_len: int | None) -> list[tuple[str, int, int]]:
    """vllm bench's ShareGPTDataset.load_data + sample + maybe_oversample_requests."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    data = [e for e in json.loads(path.read_text())
            if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)
    samples = []
    for entry in data:
        if len(samples) >= n:
            break
        prompt, completion = entry["conversations"][0]["value"], entry["conversations"][1]["value"]
        p, o = len(tok.encode(prompt).ids), len(tok.encode(completion).ids)
        o = o if output_len is None else output_len
        if p < 4 or (output_len is None and o < 4) or p > 1024 or p + o > 2048:
            continue
        samples.append((prompt, p, o))
    if len(samples) < n:
        random.seed(seed)
        samples += [random.choice(samples) for _ in range(n - len(samples))]
    return samples


@pytest.mark.parametrize(("n", "output_len"), [(10, None), (50, None), (12, 7)])
def test_sharegpt_matches_vllm_bench(tmp_path: Path, tiny_model: Path, n: int,
                                     output_len: int | None) -> None:
    path = sharegpt_file(tmp_path / "sg.json")
    w = build_workload(WorkloadConfig(dataset_name="sharegpt", dataset_path=str(path),
                                      tokenizer=str(tiny_model), num_prompts=n, seed=5,
                                      sharegpt_output_len=output_len, request_rate=3.0))
    expected = vllm_sharegpt(path, tiny_model, n, 5, output_len)
    assert w.extra["prompt_texts"] == [p for p, _, _ in expected]
    assert w.prompt_lens.tolist() == [p for _, p, _ in expected]
    assert w.output_lens.tolist() == [o for _, _, o in expected]
    assert len(w) == n and w.send_time_s[-1] == pytest.approx(n / 3.0)


def test_sharegpt_errors(tmp_path: Path, tiny_model: Path) -> None:
    path = sharegpt_file(tmp_path / "sg.json")
    with pytest.raises(WorkloadError, match="tokenizer"):
        WorkloadConfig(dataset_name="sharegpt", dataset_path=str(path))
    with pytest.raises(WorkloadError, match=r"tokenizer\.json is missing"):
        build_workload(WorkloadConfig(dataset_name="sharegpt", dataset_path=str(path),
                                      tokenizer=str(tmp_path)))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(WorkloadError, match="not a ShareGPT JSON file"):
        build_workload(WorkloadConfig(dataset_name="sharegpt", dataset_path=str(
            tmp_path / "bad.json"), tokenizer=str(tiny_model)))
    # a .json dataset path implies the sharegpt dataset
    class Args:
        dataset_path = str(path)
    assert config_dict_from_args(Args(), {})["workload"]["dataset_name"] == "sharegpt"


def test_ramp_up_matches_vllm_bench_draws() -> None:
    n, start, end, k, seed = 40, 2.0, 20.0, 0.5, 9
    for strategy in ("linear", "exponential"):
        rates = ramp_up_rates(n, strategy, start, end)
        assert rates[0] == start and rates[-1] == pytest.approx(end)
        np.random.seed(seed)  # vllm bench: one np.random.gamma call per request, no rescaling
        gaps = [np.random.gamma(shape=k, scale=1 / (r * k)) for r in rates]
        assert np.allclose(ramp_up_send_times(n, strategy, start, end, k, seed),
                           np.cumsum(gaps), rtol=0, atol=1e-12)
    w = build_workload(WorkloadConfig(dataset_name="random", num_prompts=n, random_input_len=8,
                                      random_output_len=4, ramp_up_strategy="linear",
                                      ramp_up_start_rps=start, ramp_up_end_rps=end, seed=seed))
    assert np.allclose(w.send_time_s, ramp_up_send_times(n, "linear", start, end, 1.0, seed))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"ramp_up_strategy": "linear"}, "both ramp_up_start_rps"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 5.0, "ramp_up_end_rps": 1.0},
     "0 < start <= end"),
    ({"ramp_up_strategy": "sine", "ramp_up_start_rps": 1.0, "ramp_up_end_rps": 2.0},
     "unknown ramp_up_strategy"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1.0, "ramp_up_end_rps": 2.0,
      "request_rate": 3.0}, "do not give request_rate"),
    ({"ramp_up_start_rps": 1.0}, "need ramp_up_strategy"),
])
def test_bad_ramp_up(kwargs: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        WorkloadConfig(**kwargs)
