"""``twinserve make-tiny-model`` and ``twinserve generate`` end to end (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from tests.worker.hf_reference import hf_greedy


def test_make_tiny_model_then_generate_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny"
    assert main(["make-tiny-model", str(model), "--arch", "qwen2", "--num-layers", "1",
                 "--seed", "3"]) == 0
    assert Path(capsys.readouterr().out.strip()) == model
    argv = ["generate", "--model", str(model), "--device", "cpu", "--max-tokens", "6",
            "--prompt", "Hello world", "--prompt-token-ids", "1,2,3", "--json",
            "--block-size", "4", "--kv-cache-memory", "1MiB"]
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 2
    for record in records:
        assert set(record) == {"prompt_token_ids", "output_token_ids", "text", "finish_reason"}
        assert len(record["output_token_ids"]) == 6 or record["finish_reason"] == "stop"
    assert records[1]["prompt_token_ids"] == [1, 2, 3]
    expected = hf_greedy(model, [1, 2, 3], len(records[1]["output_token_ids"]))
    assert records[1]["output_token_ids"] == expected.token_ids  # greedy by default
    assert main([*argv, "--temperature", "0.9", "--seed", "7"]) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--temperature", "0.9", "--seed", "7", "--async-scheduling"]) == 0
    assert capsys.readouterr().out == first  # seeded sampling: same output, other schedule


def test_generate_plain_text_and_chat(llama_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["generate", "--model", str(llama_dir), "--device", "cpu", "--max-tokens", "3",
            "--kv-cache-memory", "1MiB"]
    assert main([*base, "--prompt", "Hi", "--chat"]) == 0
    assert len(capsys.readouterr().out.splitlines()) >= 1
    assert main([*base, "--prompt-token-ids", "1,x"]) == 2  # argparse's error, one line
    assert "comma-separated" in capsys.readouterr().err
    assert main([*base]) == 2
    assert "--prompt" in capsys.readouterr().err


def test_make_tiny_model_is_deterministic(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert main(["make-tiny-model", str(tmp_path / name), "--num-shards", "2"]) == 0
    for file in sorted(p.name for p in (tmp_path / "a").iterdir()):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    assert main(["make-tiny-model", str(tmp_path / "c"), "--num-shards", "2", "--seed", "1"]) == 0
    shard = "model-00001-of-00002.safetensors"
    assert (tmp_path / "c" / shard).read_bytes() != (tmp_path / "a" / shard).read_bytes()
