"""A data-parallel run split over processes ("shards") and merged back into one run.

With an open-loop client and a router that reads no replica state (``round_robin``,
``random``, ``consistent_hash``), every request's front-end times and replica are known before
the run (``sim/sharding.py``), and no replica's work reaches another. ``simulate_sharded``
then plans the shards (contiguous blocks of replicas), runs each in a worker — a local
process pool or a Ray cluster, whatever ``submit`` hands the calls to — and merges their event
logs into the log the single-process run writes: the same requests, steps and token runs,
bit for bit (the steps renumbered as one run numbers them, ``EventLog.compact_step_ids``).
Every simulated time depends on the run's inputs only (``sim/clock.py``), so a replica's
records do not depend on which other replicas shared its process.

``why_not_shardable`` says why a configuration stays in one process: one replica, a router
that reads replica state, or a closed-loop client (its sends wait for deliveries from every
replica).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.compiled import loaded_compiled_modules
from engine.core.events import EventLog
from sim.cluster import INDEPENDENT_ROUTERS, RouterInputs
from sim.config import SimConfig, resolve_engine_config
from sim.replica import STEP_ID_STRIDE
from sim.runtime import SimResult, SimRuntime, SimStats
from sim.sharding import Shard, plan_shards
from workload.build import build_workload
from workload.stream import Workload

#: How shards are handed to workers: ``submit(fn, *args)`` returns a future of ``fn(*args)``.
Submit = Callable[..., "Future[ShardResult]"]


def why_not_shardable(cfg: SimConfig) -> str | None:
    """Why ``cfg`` cannot be split over processes (None: it can)."""
    if cfg.data_parallel_size < 2:
        return "it has one replica (--data-parallel-size 1)"
    if cfg.router not in INDEPENDENT_ROUTERS:
        return (f"router {cfg.router} reads the replicas' state (routers that do not: "
                f"{', '.join(INDEPENDENT_ROUTERS)})")
    if cfg.workload.max_concurrency is not None:
        return "its client is a closed loop (--max-concurrency): each send waits on deliveries"
    return None


@dataclass(slots=True)
class ShardResult:
    """What a worker sends back: its log (``EventLog.export()``, step ids not compacted) and
    counters."""

    requests: np.ndarray  # the shard's requests (global indices), in send order
    exported: dict[str, Any]
    num_rejected: int
    num_bulk_steps: int
    num_bulk_runs: int
    simulated_time_s: float
    wall_time_s: float
    output_busy_s: dict[int, float]  # replica -> its output processor's busy time
    reject_reasons: dict[str, str] = field(default_factory=dict)
    compiled_modules: int = 0  # modules that ran compiled in the worker


def run_shard(cfg_dict: dict[str, Any], shard: Shard) -> ShardResult:
    """Simulate one shard of ``cfg_dict``'s run (in a worker; a module-level function, so
    process pools and Ray import it by name)."""
    cfg = SimConfig.from_dict(cfg_dict)
    runtime = SimRuntime(cfg, shard=shard)
    result = runtime.run()
    stats = result.stats
    return ShardResult(
        requests=shard.requests,
        exported=result.event_log.export(),
        num_rejected=stats.num_rejected,
        num_bulk_steps=stats.num_bulk_steps,
        num_bulk_runs=stats.num_bulk_runs,
        simulated_time_s=stats.simulated_time_s,
        wall_time_s=stats.wall_time_s,
        output_busy_s={r.index: r.out.busy_s for r in runtime.replicas},
        reject_reasons=result.reject_reasons,
        compiled_modules=len(loaded_compiled_modules()),
    )


def shard_plan(cfg: SimConfig, workload: Workload, num_shards: int) -> list[Shard]:
    """``cfg``'s run in at most ``num_shards`` shards (it must be shardable)."""
    why = why_not_shardable(cfg)
    if why is not None:
        raise ValueError(f"this run cannot be sharded: {why}")
    engine = resolve_engine_config(cfg)
    inputs = RouterInputs(cfg.data_parallel_size, workload, cfg.seed, cfg.router_load_cap)
    return plan_shards(workload, cfg.frontend, engine.scheduler.max_model_len, cfg.router,
                       inputs, num_shards)


def simulate_sharded(cfg: SimConfig, num_shards: int, submit: Submit) -> SimResult:
    """Run ``cfg`` (shardable) as up to ``num_shards`` shards through ``submit``; the merged
    result equals ``run_simulation(cfg)``'s, wall time and bulk counters aside."""
    start = time.perf_counter()
    workload = build_workload(cfg.workload)
    shards = shard_plan(cfg, workload, num_shards)
    cfg_dict = cfg.to_dict()
    futures = [submit(run_shard, cfg_dict, shard) for shard in shards]
    results = [f.result() for f in futures]
    log = merge_logs(results, len(workload))
    log.compact_step_ids(STEP_ID_STRIDE)
    stats = SimStats(
        num_requests=len(workload),
        num_rejected=sum(r.num_rejected for r in results),
        num_steps=log.num_steps,
        num_bulk_steps=sum(r.num_bulk_steps for r in results),
        num_bulk_runs=sum(r.num_bulk_runs for r in results),
        simulated_time_s=max(r.simulated_time_s for r in results),
        api_server_busy_s=shards[0].api_server_busy_s,
        # summed in replica order, as the single-process run sums them
        output_processor_busy_s=sum(
            busy for _, busy in sorted(
                (item for r in results for item in r.output_busy_s.items()),
                key=lambda item: item[0],
            )
        ),
    )
    stats.wall_time_s = time.perf_counter() - start
    reasons = {k: v for r in results for k, v in r.reject_reasons.items()}
    return SimResult(cfg, resolve_engine_config(cfg), workload, log, stats, reasons,
                     compiled_modules=min(r.compiled_modules for r in results))


def merge_logs(results: Sequence[ShardResult], num_requests: int) -> EventLog:
    """One log from the shards' logs: requests numbered in send order (as the single process
    numbers them: every request appears, in exactly one shard), each shard's events, token
    runs, steps and deliveries after the previous shard's (the tables read them by request and
    step id, so only each request's own order matters, and it stays). ``num_requests``: the
    run's; the shards must hold each exactly once."""
    req_ids = [""] * num_requests
    parts: dict[str, list[Any]] = {}
    for r in results:
        ex = r.exported
        if len(ex["req_ids"]) != len(r.requests):
            raise ValueError("a shard's log does not hold exactly its requests")
        for position, req_id in zip(r.requests.tolist(), ex["req_ids"], strict=True):
            if req_ids[position]:
                raise ValueError(f"request {req_id} is in two shards")
            req_ids[position] = req_id
        to_global = r.requests.astype(np.int64)
        _add(parts, "ev_req", to_global[_np(ex["events"]["req_index"], np.int64)])
        _add(parts, "ev_kind", _np(ex["events"]["kind"], np.int8))
        _add(parts, "ev_time", _np(ex["events"]["time_s"], np.float64))
        _add(parts, "ev_payload", list(ex["events"]["payload"]))
        runs = ex["token_runs"]
        _add(parts, "run_req", to_global[_np(runs["req_index"], np.int64)])
        _add(parts, "run_first", _np(runs["first_step"], np.int64))
        _add(parts, "run_count", _np(runs["num_tokens"], np.int64))
        for name, column in ex["steps"].items():
            _add(parts, "step:" + name, column if isinstance(column, list) else _np(column))
        _add(parts, "del_step", _np(ex["delivered"]["step_id"], np.int64))
        _add(parts, "del_time", _np(ex["delivered"]["time_s"], np.float64))
    if "" in req_ids:
        raise ValueError("the shards do not cover every request")
    steps = {name.removeprefix("step:"): _join(cols) for name, cols in parts.items()
             if name.startswith("step:")}
    merged = {
        "req_ids": req_ids,
        "events": {
            "req_index": _join(parts["ev_req"]), "kind": _join(parts["ev_kind"]),
            "time_s": _join(parts["ev_time"]), "payload": _join(parts["ev_payload"]),
        },
        "token_runs": {
            "req_index": _join(parts["run_req"]), "first_step": _join(parts["run_first"]),
            "num_tokens": _join(parts["run_count"]),
        },
        "steps": steps,
        "delivered": {"step_id": _join(parts["del_step"]), "time_s": _join(parts["del_time"])},
    }
    return EventLog.from_export(merged)


def _np(column: Any, dtype: Any = None) -> np.ndarray:
    """A typed-array column as numpy (its own item type unless ``dtype``)."""
    code = getattr(column, "typecode", None)
    raw = np.frombuffer(column, dtype=np.dtype(code)) if code and len(column) else np.asarray(
        column
    )
    return raw if dtype is None else raw.astype(dtype)


def _add(parts: dict[str, list[Any]], name: str, values: Any) -> None:
    parts.setdefault(name, []).append(values)


def _join(chunks: list[Any]) -> Any:
    """Concatenated chunks: lists stay lists, arrays become a plain list (what ``array()``
    takes) — numpy scalars are never handed to the log."""
    if isinstance(chunks[0], list):
        return [v for chunk in chunks for v in chunk]
    return np.concatenate(chunks).tolist()
