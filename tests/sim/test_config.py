"""Simulation configs: vLLM's per-GPU defaults, KV capacity from memory, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.config import ConfigError
from engine.core.errors import UserError
from experiments.cli import main
from sim.config import EngineKnobs, SimConfig, kv_capacity, resolve_engine_config
from sim.workload import WorkloadConfig


def test_default_is_vllm_online_serving_on_h100() -> None:
    e = resolve_engine_config(SimConfig())
    assert e.scheduler.max_num_batched_tokens == 8192 and e.scheduler.max_num_seqs == 1024
    assert e.scheduler.async_scheduling and e.cache.enable_prefix_caching
    assert e.scheduler.enable_chunked_prefill and e.cache.block_size == 16
    assert e.scheduler.max_model_len == 131072


def test_a100_server_defaults() -> None:
    e = resolve_engine_config(SimConfig(model="meta-llama/Llama-3.1-8B", gpu="a100-80gb"))
    assert (e.scheduler.max_num_batched_tokens, e.scheduler.max_num_seqs) == (2048, 256)


def test_kv_capacity_of_llama8b_on_h100_is_realistic() -> None:
    cap = kv_capacity(SimConfig())
    tokens = (cap.num_gpu_blocks - 1) * 16
    # vLLM reports ~450k tokens of KV cache for this model on an 80 GB H100 at 0.9-0.92
    assert 400_000 < tokens < 500_000
    assert cap.weight_bytes == pytest.approx(16.06e9, rel=0.01)


def test_tensor_parallel_doubles_kv_per_gpu_for_a_big_model() -> None:
    tp2 = kv_capacity(SimConfig(model="meta-llama/Llama-3.1-70B", tensor_parallel_size=2))
    tp4 = kv_capacity(SimConfig(model="meta-llama/Llama-3.1-70B", tensor_parallel_size=4))
    assert tp4.num_gpu_blocks > 2 * tp2.num_gpu_blocks


def test_model_that_does_not_fit() -> None:
    with pytest.raises(ConfigError, match=r"does not fit on 1 x a100-80gb.*raise tensor_parallel"):
        resolve_engine_config(SimConfig(model="meta-llama/Llama-3.1-70B", gpu="a100-80gb"))


def test_max_model_len_larger_than_kv() -> None:
    with pytest.raises(ConfigError, match="needs 1025 KV blocks but only 99 fit"):
        resolve_engine_config(SimConfig(num_gpu_blocks=100, max_model_len=16400))


def test_kv_too_small_shrinks_max_model_len_like_vllm() -> None:
    e = resolve_engine_config(SimConfig(num_gpu_blocks=101))
    assert e.scheduler.max_model_len == 1600


def test_dict_round_trip_and_unknown_keys() -> None:
    cfg = SimConfig(engine=EngineKnobs(max_num_seqs=64),
                    workload=WorkloadConfig(request_rate=float("inf"), priority_mix=((0, 1.0),)))
    again = SimConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    with pytest.raises(ConfigError, match=r"unknown key\(s\) max_num_seq in \[engine\].*valid"):
        SimConfig.from_dict({"engine": {"max_num_seq": 1}})
    with pytest.raises(ConfigError, match=r"unknown key.*gpus.*valid top-level keys"):
        SimConfig.from_dict({"gpus": "h100"})


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "gpt-5"], "unknown model 'gpt-5'; valid: meta-llama/Llama-3.1-8B"),
        (["--gpu", "tpu"], "unknown GPU 'tpu'; valid: a100-80gb, h100-sxm, h200-sxm"),
        (["--request-rate", "-2"], "request_rate must be > 0"),
        (["--dataset-path", "nope.csv"], "trace file 'nope.csv' not found"),
        (["--num-gpu-blocks-override", "10", "--max-model-len", "4096"], "needs 256 KV blocks"),
        (["--max-num-seqs", "0"], "max_num_seqs must be a positive integer"),
        (["--model", "meta-llama/Llama-3.1-70B", "--gpu", "a100-80gb"], "does not fit"),
    ],
)
def test_simulate_bad_input_is_one_line(argv: list[str], match: str,
                                        capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    code = main(["simulate", "--no-plots", "--out", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("twinserve: error: ")
    import re

    assert re.search(match, err), err


def test_experiment_file_with_unknown_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "exp.toml"
    f.write_text('model = "meta-llama/Llama-3.1-8B"\n[engine]\nmax_num_batched_token = 10\n')
    assert main(["simulate", "--config", str(f), "--no-plots"]) == 2
    assert "max_num_batched_token" in capsys.readouterr().err


def test_labels_outside_the_catalogs_need_a_fitted_model_and_explicit_kv() -> None:
    cfg = SimConfig(model="/ckpt/tiny", gpu="cpu", cost_model="fitted:x.json",
                    num_gpu_blocks=64, max_model_len=512,
                    engine=EngineKnobs(max_num_batched_tokens=256, max_num_seqs=8))
    e = resolve_engine_config(cfg)
    assert (e.cache.num_gpu_blocks, e.scheduler.max_model_len) == (64, 512)
    with pytest.raises(UserError, match=r"unknown model ./ckpt/tiny."):
        SimConfig(model="/ckpt/tiny", gpu="cpu", num_gpu_blocks=64, max_model_len=512)
