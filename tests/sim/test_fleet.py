"""A sharded data-parallel run writes the single-process run's records, bit for bit.

Each configuration is simulated once in one process and once split into shards (in this
process, then in a process pool); the request, step and token-run tables must be equal row for
row and the summaries equal. The configurations load the replicas enough for chunked prefills,
prefix hits, preemptions, bulk runs and idle periods, and vary what routes (round robin,
random, consistent hashing), the shard count (also uneven blocks), the front end (several API
servers, network latency), rejections and synchronous scheduling.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from engine.compiled import loaded_compiled_modules
from experiments.run_meta import simulated_run_meta
from experiments.sweep.backends import PoolBackend, RayBackend
from reports.metrics import summarize
from reports.tables import build_tables
from sim.config import SimConfig
from sim.fleet import (
    ShardResult,
    merge_logs,
    run_shard,
    shard_plan,
    simulate_sharded,
    why_not_shardable,
)
from sim.runtime import SimRuntime, run_simulation
from workload.build import build_workload

ROOT = Path(__file__).resolve().parents[2]

BUSY = {"num_gpu_blocks": 600, "max_model_len": 4096,
        "engine": {"max_num_batched_tokens": 1024, "max_num_seqs": 64}}

CONFIGS: dict[str, dict[str, Any]] = {
    "round-robin, preemptions, 2 API servers": {
        **BUSY, "data_parallel_size": 4, "router": "round_robin",
        "frontend": {"num_api_servers": 2, "network_latency_s": 0.003},
        "workload": {"dataset_name": "prefix_repetition", "num_prompts": 500,
                     "request_rate": 60, "prefix_repetition_prefix_len": 512,
                     "prefix_repetition_suffix_len": 512, "prefix_repetition_output_len": 96},
    },
    "random, rejections, sync": {
        **BUSY, "data_parallel_size": 3, "router": "random", "max_model_len": 1500,
        "engine": {"max_num_batched_tokens": 512, "async_scheduling": False},
        "workload": {"dataset_name": "random", "num_prompts": 400, "request_rate": 40,
                     "random_input_len": 900, "random_output_len": 200,
                     "random_range_ratio": 0.6, "seed": 4},
    },
    "consistent hash, mooncake": {
        "data_parallel_size": 5, "router": "consistent_hash", "num_gpu_blocks": 3000,
        "workload": {"dataset_name": "trace", "dataset_path": "mooncake-conversation",
                     "num_prompts": 300, "trace_time_scale": 4.0},
    },
}


def _inline(fn: Callable[..., ShardResult], *args: Any) -> Future[ShardResult]:
    future: Future[ShardResult] = Future()
    future.set_result(fn(*args))
    return future


def _assert_same_run(cfg: SimConfig, shards: int, submit: Any) -> None:
    single = run_simulation(cfg)
    sharded = simulate_sharded(cfg, shards, submit)
    a, b = build_tables(single.event_log), build_tables(sharded.event_log)
    for name in ("requests", "steps", "token_runs"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    summaries = [summarize(t, simulated_run_meta(r)) for t, r in ((a, single), (b, sharded))]
    for summary in summaries:
        summary.pop("date")
    assert summaries[0] == summaries[1]
    s, m = single.stats, sharded.stats
    for key in ("num_requests", "num_rejected", "num_steps", "simulated_time_s",
                "api_server_busy_s", "output_processor_busy_s"):
        assert getattr(s, key) == getattr(m, key), key
    # a replica's bulk runs stop only for its own requests, wherever the others run
    assert (s.num_bulk_steps, s.num_bulk_runs) == (m.num_bulk_steps, m.num_bulk_runs)
    assert single.reject_reasons == sharded.reject_reasons
    assert list(single.reject_reasons) == list(sharded.reject_reasons)  # send order
    # the run did what the configuration is for
    steps = a.steps
    assert steps["num_prefill_reqs"].gt(0).any() and s.num_bulk_steps > 0
    assert steps["replica"].nunique() == cfg.data_parallel_size


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_run_equals_single_process_run(name: str, shards: int) -> None:
    _assert_same_run(SimConfig.from_dict(CONFIGS[name]), shards, _inline)


LIGHT = {"data_parallel_size": 3, "router": "round_robin",
         "workload": {"num_prompts": 300, "request_rate": 30}}


@pytest.mark.parametrize("values", [LIGHT, CONFIGS["random, rejections, sync"]],
                         ids=["light round robin", "random, rejections, sync"])
def test_bulk_runs_past_other_replicas_arrivals_change_nothing(values: dict[str, Any]) -> None:
    """In a planned run a replica's bulk runs stop only for its own requests; the records
    are those of the step-by-step run (the light load has long bulk runs between arrivals)."""
    fast = run_simulation(SimConfig.from_dict(values))
    slow = run_simulation(SimConfig.from_dict({**values, "fast_path": False}))
    assert fast.stats.num_bulk_steps > 0 and slow.stats.num_bulk_steps == 0
    a, b = build_tables(fast.event_log), build_tables(slow.event_log)
    for table in ("requests", "steps", "token_runs"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), check_exact=True)


def test_the_configurations_cover_what_they_claim() -> None:
    cfg = SimConfig.from_dict(CONFIGS["round-robin, preemptions, 2 API servers"])
    steps = build_tables(run_simulation(cfg).event_log).steps
    assert steps["num_preempted_reqs"].sum() > 0
    cfg = SimConfig.from_dict(CONFIGS["random, rejections, sync"])
    result = run_simulation(cfg)
    assert 0 < result.stats.num_rejected < 400


def test_a_sharded_run_states_what_ran_compiled_in_its_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run directory says how many modules ran compiled where the run was simulated: a
    sharded run's workers (the fewest of any), not the process that merges them."""
    import sim.fleet

    counts = iter([["a", "b", "c"], ["a", "b"]])  # two workers, one with fewer compiled
    monkeypatch.setattr(sim.fleet, "loaded_compiled_modules", lambda: next(counts))
    result = simulate_sharded(SimConfig.from_dict(LIGHT), 2, _inline)
    assert result.compiled_modules == 2
    assert simulated_run_meta(result).provenance.compiled_modules == 2
    single = run_simulation(SimConfig.from_dict(LIGHT))
    assert single.compiled_modules is None  # this process's, counted when described
    assert simulated_run_meta(single).provenance.compiled_modules == len(
        loaded_compiled_modules())


def test_shards_in_a_process_pool() -> None:
    cfg = SimConfig.from_dict(CONFIGS["round-robin, preemptions, 2 API servers"])
    pool = PoolBackend(2)
    try:
        _assert_same_run(cfg, 2, pool.submit_call)
    finally:
        pool.close()


@pytest.mark.ray
def test_shards_on_ray() -> None:
    """Marked ``ray`` (starts a local Ray; ``make test-all``), skipped without Ray."""
    pytest.importorskip("ray")
    cfg = SimConfig.from_dict(CONFIGS["consistent hash, mooncake"])
    backend = RayBackend(num_cpus=2)
    try:
        _assert_same_run(cfg, 3, backend.submit_call)
    finally:
        backend.close()


def test_every_request_in_one_shard_and_the_rejected_ones_in_the_first() -> None:
    cfg = SimConfig.from_dict(CONFIGS["random, rejections, sync"])
    workload = build_workload(cfg.workload)
    shards = shard_plan(cfg, workload, 2)
    assert [s.replicas for s in shards] == [(0, 1), (2,)]
    everything = np.sort(np.concatenate([s.requests for s in shards]))
    assert (everything == np.arange(len(workload))).all()
    assert (shards[0].route == -1).any() and not (shards[1].route == -1).any()
    assert shards[1].route.min() == 2 and shards[0].route.max() <= 1
    assert len(shard_plan(cfg, workload, 10)) == 3  # never more shards than replicas


def test_a_merge_missing_a_request_is_refused() -> None:
    cfg = SimConfig.from_dict(CONFIGS["random, rejections, sync"])
    shards = shard_plan(cfg, build_workload(cfg.workload), 3)
    results = [run_shard(cfg.to_dict(), s) for s in shards]
    with pytest.raises(ValueError, match="do not cover every request"):
        merge_logs(results[:2], 400)
    with pytest.raises(ValueError, match="is in two shards"):
        merge_logs([*results, results[1]], 400)
    assert merge_logs(results, 400).num_steps == sum(
        len(r.exported["steps"]["step_id"]) for r in results
    )


def test_why_a_run_stays_in_one_process() -> None:
    def why(**values: Any) -> str | None:
        return why_not_shardable(SimConfig.from_dict(values))

    assert why(data_parallel_size=4, router="round_robin") is None
    assert "one replica" in str(why(router="round_robin"))
    assert "router vllm reads the replicas' state" in str(why(data_parallel_size=2))
    assert "closed loop" in str(why(data_parallel_size=2, router="random",
                                    workload={"max_concurrency": 8}))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_simulate_shards_from_the_command_line(tmp_path: Path) -> None:
    common = ["simulate", "--no-plots", "--no-progress", "-dp", "3", "--router", "round_robin",
              "--num-prompts", "150", "--request-rate", "20"]
    one = _cli(*common, "--out", str(tmp_path / "one"))
    two = _cli(*common, "--shards", "2", "--out", str(tmp_path / "two"))
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert one.stdout == two.stdout
    for table in ("requests", "steps", "token_runs"):
        assert (tmp_path / "one" / f"{table}.parquet").read_bytes() == (
            tmp_path / "two" / f"{table}.parquet"
        ).read_bytes(), table
    note = _cli("simulate", "--no-plots", "--no-progress", "-dp", "2", "--num-prompts", "20",
                "--shards", "2", "--out", str(tmp_path / "note"))
    assert note.returncode == 0, note.stderr
    assert ("not sharding this run: router vllm reads the replicas' state" in note.stderr)
    bad = _cli("simulate", "--backend", "ray", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1].startswith("twinserve: error: --backend")
    for count, message in (("0", "--shards must be >= 1"), ("5000", "--shards must be <= ")):
        wrong = _cli("simulate", "--shards", count, "--out", str(tmp_path / f"bad{count}"))
        assert wrong.returncode != 0
        assert wrong.stderr.strip().splitlines()[-1].startswith(f"twinserve: error: {message}")


def test_replayed_front_end_times_route_without_a_plan() -> None:
    """A run that replays measured front-end times is not planned (the plan prices the front
    end with the config's model): with round robin it routes through the router process, by
    the replayed times."""
    cfg = SimConfig.from_dict(LIGHT)
    n = len(build_workload(cfg.workload))
    slow_front = [0.05] * n  # every request spends 50 ms in the API server
    replayed = SimRuntime(cfg, request_frontend_s=slow_front)
    assert replayed.shard is None and replayed.picker is not None
    result = replayed.run()
    planned = run_simulation(cfg)
    a, b = build_tables(result.event_log), build_tables(planned.event_log)
    assert (a.requests["replica"] == b.requests["replica"]).all()  # round robin either way
    assert a.requests["ttft_s"].mean() > b.requests["ttft_s"].mean()
    with pytest.raises(ValueError, match="planned"):
        SimRuntime(cfg, shard=shard_plan(cfg, build_workload(cfg.workload), 1)[0],
                   request_frontend_s=slow_front)
