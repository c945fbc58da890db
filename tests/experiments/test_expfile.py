"""Experiment files: key spellings, grid/variant/seed expansion, and bad input rejected with
the list of what is valid."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from experiments.sweep.expfile import (
    ExperimentError,
    expand_points,
    load_experiment,
    parse_experiment,
    resolve_key,
    valid_keys,
    with_base_overrides,
)


def test_key_spellings_resolve_to_canonical_paths() -> None:
    assert resolve_key("workload.request_rate") == "workload.request_rate"
    assert resolve_key("request_rate") == "workload.request_rate"
    assert resolve_key("request-rate") == "workload.request_rate"
    assert resolve_key("max-num-batched-tokens") == "engine.max_num_batched_tokens"
    assert resolve_key("scheduling_policy") == "engine.policy"
    assert resolve_key("num_gpu_blocks_override") == "num_gpu_blocks"
    assert resolve_key("data_parallel_size") == "data_parallel_size"
    assert resolve_key("priority_mix") == "workload.priority_mix"  # only one section has it
    assert "engine.enable_chunked_prefill" in valid_keys()


def test_unknown_key_lists_the_valid_ones() -> None:
    with pytest.raises(ExperimentError) as err:
        resolve_key("max_num_batched_tokenz")
    msg = str(err.value)
    assert "did you mean" in msg and "max_num_batched_tokens" in msg
    assert "workload.request_rate" in msg and "engine.enable_prefix_caching" in msg
    with pytest.raises(ExperimentError, match="valid keys"):
        resolve_key("engine.nope")


def _spec(text: str):  # type: ignore[no-untyped-def]
    return parse_experiment(tomllib.loads(text))


def test_grid_variants_and_seeds_expand_in_order() -> None:
    spec = _spec("""
        [base.workload]
        dataset_name = "random"
        num_prompts = 20
        [grid]
        workload.request_rate = [2, 4]          # an unquoted dotted key is a nested table
        "enable-chunked-prefill" = [true, false]
        seeds = [0, 7]
        [[variant]]
        name = "a"
        [[variant]]
        name = "b"
        max_num_seqs = 8
    """)
    points = expand_points(spec)
    assert len(points) == 2 * 2 * 2 * 2
    assert [p.variant for p in points[:8]] == ["a"] * 8
    assert [p.seed for p in points[:4]] == [0, 7, 0, 7]
    p = points[-1]
    assert p.variant == "b" and p.seed == 7
    assert dict(p.axis_values) == {"workload.request_rate": 4,
                                   "engine.enable_chunked_prefill": False}
    cfg = p.config
    assert cfg["engine"]["max_num_seqs"] == 8 and cfg["engine"]["enable_chunked_prefill"] is False
    assert cfg["workload"]["request_rate"] == 4.0
    assert cfg["workload"]["seed"] == 7 and cfg.get("seed", 7) == 7  # seeds reach the workload
    assert [q.index for q in points] == list(range(16))


def test_defaults_and_trace_rates_follow_simulate() -> None:
    spec = _spec("""
        [base.workload]
        dataset_name = "trace"
        dataset_path = "azure-conv"
        num_prompts = 10
        [grid]
        request_rate = [3]
    """)
    (point,) = expand_points(spec)
    assert point.config["workload"]["trace_rate_given"] is True  # lengths from the trace
    (plain,) = expand_points(_spec("[base]\nseed = 3\n"))
    assert plain.config["workload"]["dataset_path"] == "azure-conv"  # simulate's default
    assert plain.seed == 3 and plain.config["workload"]["seed"] == 3


def test_unknown_keys_everywhere_are_all_reported() -> None:
    with pytest.raises(ExperimentError) as err:
        _spec("""
            [base]
            [grids]
            x = [1]
            [grid]
            "engine.max_num_seqz" = [1, 2]
            [[variant]]
            name = "v"
            routerr = "round_robin"
            [report]
            goodput = ["ttft:500"]
            percentile = [50]
        """)
    msg = str(err.value)
    assert "grids" in msg and "valid: name, description, base, grid, variant" in msg
    assert "engine.max_num_seqz" in msg and "engine.max_num_seqs" in msg
    assert "routerr" in msg and "router" in msg
    assert "percentile" in msg and "percentile_metrics" in msg


def test_base_unknown_key_and_bad_values_rejected_before_running() -> None:
    spec = _spec("""
        [base]
        tensor_parallel_sise = 2
    """)
    with pytest.raises(ExperimentError, match="valid top-level keys: model, gpu"):
        expand_points(spec)
    spec = _spec("""
        [base.workload]
        dataset_name = "random"
        [grid]
        model = ["meta-llama/Llama-3.1-70B"]
        gpu = ["a100-80gb", "h100-sxm"]
        "workload.num_prompts" = [10, 0]
    """)
    with pytest.raises(ExperimentError) as err:
        expand_points(spec)
    msg = str(err.value)
    assert "does not fit" in msg  # a 70B model on one 80 GB GPU
    assert "num_prompts must be >= 1" in msg
    assert "and 1 more point(s)" in msg  # identical messages grouped


def test_grid_values_must_be_lists_and_seeds_integers() -> None:
    with pytest.raises(ExperimentError, match="must be a non-empty list"):
        _spec("[grid]\nrequest_rate = 4\n")
    with pytest.raises(ExperimentError, match="seeds must be a non-empty list of integers"):
        _spec("[grid]\nseeds = ['a']\n")
    with pytest.raises(ExperimentError, match="same setting"):
        _spec("[grid]\nrequest_rate = [1]\n'workload.request_rate' = [2]\n")


def test_example_files_are_valid() -> None:
    examples = sorted((Path(__file__).parents[2] / "experiments" / "examples").glob("*.toml"))
    assert len(examples) >= 5
    for path in examples:
        spec = load_experiment(path)
        assert expand_points(spec), path


def test_report_options_are_parsed() -> None:
    spec = _spec("""
        [report]
        goodput = ["ttft:500", "tpot:50"]
        percentiles = [50, 99]
    """)
    assert spec.report["goodput"] == {"ttft": 500.0, "tpot": 50.0}
    assert spec.report["percentiles"] == [50.0, 99.0]
    with pytest.raises(ExperimentError, match="goodput"):
        _spec("[report]\ngoodput = ['latency:5']\n")
    with pytest.raises(ExperimentError, match=r"\[report\] goodput must be a list .* got 5"):
        _spec("[report]\ngoodput = 5\n")
    with pytest.raises(ExperimentError, match=r"\[report\] percentiles must be a list, got 99"):
        _spec("[report]\npercentiles = 99\n")


def test_seed_axes_and_set_on_an_axis_are_refused() -> None:
    with pytest.raises(ExperimentError, match=r"\[grid\] workload.seed: give the run's seeds"):
        _spec('[grid]\n"workload.seed" = [1, 2]\nseeds = [0, 1]\n')
    spec = _spec('[grid]\n"workload.request_rate" = [2, 4]\n')
    with pytest.raises(ExperimentError, match=r"--set request_rate: workload.request_rate is a"):
        with_base_overrides(spec, ["request_rate=3"])
    assert with_base_overrides(spec, ["num_prompts=7"]).base["workload"]["num_prompts"] == 7


def test_a_name_that_would_leave_the_runs_directory_is_refused() -> None:
    with pytest.raises(ExperimentError, match="name must be letters, digits"):
        _spec('name = "../../tmp/evil"\n')
    assert _spec('name = "chunked-prefill_v2.1"\n').name == "chunked-prefill_v2.1"
