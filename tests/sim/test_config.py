"""Simulation configs: vLLM's per-GPU defaults, KV capacity from memory, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.config import ConfigError, EngineKnobs
from engine.core.errors import UserError
from experiments.cli import main
from sim.config import SimConfig, kv_capacity, resolve_engine_config
from sim.cost.cuda_graphs import CudaGraphConfig
from sim.cost.host import HostCosts
from workload.config import WorkloadConfig


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
    # the vLLM step model's knobs round-trip too (capture sizes come back as a tuple)
    vllm_cfg = SimConfig(
        cost_model="vllm", quantization="fp8", kv_cache_dtype="fp8_e4m3", dtype="bfloat16",
        cuda_graphs=CudaGraphConfig(cudagraph_capture_sizes=(1, 8, 64),
                                    max_cudagraph_capture_size=64),
        host_costs=HostCosts(prepare_s=2e-4, kernel_launch_s=4e-6))
    again = SimConfig.from_dict(json.loads(json.dumps(vllm_cfg.to_dict())))
    assert again == vllm_cfg and again.cuda_graphs.cudagraph_capture_sizes == (1, 8, 64)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) max_num_seq in \[engine\].*valid"):
        SimConfig.from_dict({"engine": {"max_num_seq": 1}})
    with pytest.raises(ConfigError, match=r"unknown key.*gpus.*valid top-level keys"):
        SimConfig.from_dict({"gpus": "h100"})


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "gpt-5"],
         r"unknown model 'gpt-5'; valid: .*meta-llama/Llama-3\.1-8B.*or a path to a config"),
        (["--gpu", "tpu"],
         "unknown GPU 'tpu'; valid: a100-40gb, a100-80gb, b200, gb200, h100-pcie, h100-sxm"),
        (["--request-rate", "-2"], "request_rate must be > 0"),
        (["--dataset-path", "nope.csv"], "trace file 'nope.csv' not found"),
        (["--num-gpu-blocks-override", "10", "--max-model-len", "4096"], "needs 256 KV blocks"),
        (["--max-num-seqs", "0"], "max_num_seqs must be a positive integer"),
        (["--model", "meta-llama/Llama-3.1-70B", "--gpu", "a100-80gb"], "does not fit"),
        (["--block-size", "1000000"], "hold 0 block.*of 1000000 tokens.*lower block_size"),
        (["--seed", "-1"], "seed must be >= 0, got -1"),
        # report flags are checked before the run, with the parser `report` uses
        (["--goodput", "ttft:nan"], "invalid goodput value ttft:nan"),
        (["--metric-percentiles", "50,,99"], "invalid percentile ''"),
        (["--max-model-len", "0"], "max_model_len must be >= 2 tokens"),
        (["--num-gpu-blocks-override", "0"], "num_gpu_blocks must be >= 2"),
        (["--num-gpu-blocks-override", str(10**12)], "num_gpu_blocks must be <= 100,000,000"),
        (["-dp", "10000"], r"data_parallel_size must be in \[1, 1024\]"),
        # the layout rules the real engine applies (engine/core/parallel.py), same messages
        (["-tp", "3"], r"tensor_parallel_size 3 does not divide .*'s 32 attention heads"),
        (["-pp", "33"], r"pipeline_parallel_size 33 exceeds .*'s 32 decoder layers"),
        (["--api-server-count", str(10**20)], r"num_api_servers must be in \[1, 100,000\]"),
        # arrival times that overflow (or nearly) would hang the run or fake a rate-inf one
        (["--dataset-name", "random", "--request-rate", "1e-300"],
         r"arrival times overflow or span more than 1e\+15 s.*request_rate \(1e-300\)"),
        (["--dataset-path", "azure-code", "--trace-time-scale", "5e-324"],
         r"arrival times overflow.*trace_time_scale \(5e-324\) is too small"),
        (["--num-prompts", str(3 * 10**9)], "num_prompts must be <= 100,000,000"),
        (["--dataset-name", "random", "--random-input-len", str(10**20)],
         "random_input_len must be <= 1,099,511,627,776 tokens"),
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


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"tensor_parallel_size": "2"}, r"^tensor_parallel_size must be an integer, got '2'$"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be an integer, got True"),
        ({"data_parallel_size": 1.5}, "data_parallel_size must be an integer, got 1.5"),
        ({"gpu_memory_utilization": "0.9"}, "gpu_memory_utilization must be a finite number"),
        ({"max_model_len": 4096.5}, "max_model_len must be an integer or null, got 4096.5"),
        ({"max_model_len": 0}, "max_model_len must be >= 2 tokens"),
        ({"num_gpu_blocks": 1}, "num_gpu_blocks must be >= 2"),
        ({"model": None}, "model must be a string, got None"),
        ({"fast_path": "no"}, "fast_path must be true or false, got 'no'"),
        ({"router_load_cap": -1}, "router_load_cap must be >= 0, got -1"),
        ({"engine": {"block_size": 16.0}}, r"\[engine\] block_size must be an integer, got 16.0"),
        ({"engine": {"policy": 5}}, r"\[engine\] policy must be a string, got 5"),
        # NaN or infinite costs would make a run that never ends
        ({"frontend": {"tokenize_s_per_token": float("inf")}},
         r"\[frontend\] tokenize_s_per_token must be a finite number, got inf"),
        ({"frontend": {"idle_wakeup_s": float("nan")}}, "idle_wakeup_s must be a finite number"),
        ({"frontend": {"network_latency_s": 1e308}},
         r"network_latency_s must be a number in \[0, "),
        ({"frontend": {"num_api_servers": 1.5}}, "num_api_servers must be an integer"),
        ({"roofline": {"step_overhead_s": float("inf")}}, "step_overhead_s must be a finite"),
        ({"roofline": {"activation_bytes": "x"}}, "activation_bytes must be an integer"),
        ({"roofline": {"attention_compute_efficiency": 1e-300}},
         r"attention_compute_efficiency must be in \[0.001, 1\]"),
        ({"workload": {"num_prompts": 5.5}}, r"\[workload\] num_prompts must be an integer"),
        ({"workload": {"num_prompts": True}}, "num_prompts must be an integer, got True"),
        ({"workload": {"request_rate": "fast"}}, "request_rate must be a number \\(or inf\\)"),
        ({"workload": {"request_rate": None}}, "request_rate must be a number"),
        ({"workload": {"random_input_len": float("nan")}}, "random_input_len must be an integer"),
        ({"workload": {"priority_mix": 5}},
         r"priority_mix must be a list of \[an integer, a finite number\], got 5"),
        ({"workload": {"priority_mix": [[0, 0.5, 3]]}}, "priority_mix must be a list of"),
        ({"workload": {"seed": -1}}, "seed must be >= 0, got -1"),
        ({"workload": {"prefix_repetition_prefix_len": -1}},
         "prefix_repetition_prefix_len and prefix_repetition_suffix_len must be >= 0"),
        ({"seed": 3, "workload": 5}, "section 'workload' must be a table/object"),
        ({"engine": [1]}, "section 'engine' must be a table/object"),
    ],
)
def test_config_values_of_the_wrong_type_are_named(values: dict[str, object], match: str) -> None:
    with pytest.raises(UserError, match=match):
        SimConfig.from_dict(values)


def test_infinity_where_it_means_something() -> None:
    w = SimConfig.from_dict(
        {"workload": {"request_rate": "inf", "burstiness": float("inf")}}
    ).workload
    assert w.request_rate == float("inf") and w.burstiness == float("inf")
    with pytest.raises(UserError, match="trace_time_scale must be a finite number"):
        SimConfig.from_dict({"workload": {"trace_time_scale": float("inf")}})


@pytest.mark.parametrize(
    ("argv", "dataset"),
    [
        ([], "trace"),  # the embedded default: the Azure conversation trace
        (["--random-input-len", "300"], "random"),
        (["--prefix-repetition-prefix-len", "32"], "prefix_repetition"),
        (["--dataset-path", "azure-code"], "trace"),
    ],
)
def test_dataset_flags_imply_their_dataset(argv: list[str], dataset: str) -> None:
    from experiments.cli import build_parser
    from experiments.simconfig import config_dict_from_args

    args = build_parser().parse_args(["simulate", *argv])
    cfg = SimConfig.from_dict(config_dict_from_args(args, {}))
    assert cfg.workload.dataset_name == dataset
    if dataset == "random":
        assert cfg.workload.random_input_len == 300


def test_flags_of_two_datasets_are_refused(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    code = main(["simulate", "--no-plots", "--out", str(tmp_path / "run"),
                 "--dataset-path", "azure-code", "--random-input-len", "300"])
    assert code == 2
    assert "sets keys of several datasets (trace, random)" in capsys.readouterr().err


def test_an_out_that_cannot_be_a_directory_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    regular = tmp_path / "file"
    regular.write_text("x")
    for out, message in (
        (regular, "exists and is not a directory"),
        (regular / "sub", "cannot create the output directory"),
    ):
        code = main(["simulate", "--no-plots", "--out", str(out), "--num-prompts", "3"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1
        assert "Simulated" not in err  # refused before simulating


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


def test_list_networks_shows_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.network import NETWORKS

    assert main(["simulate", "--list-networks"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == list(NETWORKS)
    assert rows[0].split()[1:3] == ["400.0", "12"]  # InfiniBand NDR: Gb/s per GPU, µs
