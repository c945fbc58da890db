"""Benchmark: reporting a 1,000,000-request run (tables, summary, each plot, table files).

Builds a synthetic but realistic ``EventLog`` with numpy (no per-request Python loop): Poisson
arrivals at ``--rate`` req/s, an engine step every ~15 ms, prompts of 128–2048 tokens, outputs
of 16–400 tokens, 5% of requests preempted once (two token runs, a PREEMPTED and a second
SCHEDULED event), KV usage and queue lengths that follow the number of running requests. Then
times what a run directory costs: ``build_columns``, ``summarize`` and ``write_tables``
(Parquet) on the columns, as a run writes them, and the DataFrames plots need
(``RunColumns.to_frames``) and each plot, printing wall time and the process's peak RSS after
each phase.

Usage: python -m bench.reports [--num-requests 1000000] [--rate 200] [--csv]
"""

from __future__ import annotations

import argparse
import functools
import resource
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.events import STEP_COLUMNS, EventKind, EventLog, StepColumns

STEP_S = 0.015  # mean engine step


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fill(target: array, values: np.ndarray) -> None:  # type: ignore[type-arg]
    target.frombytes(np.ascontiguousarray(values, dtype=np.dtype(target.typecode)).tobytes())


def synthetic_log(num_requests: int, rate: float, seed: int = 0) -> EventLog:
    """A synthetic run of ``num_requests`` requests (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n = num_requests
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    num_steps = int((arrival[-1] + 60.0) / STEP_S)
    cost = STEP_S * (0.8 + 0.4 * rng.random(num_steps))
    update = np.cumsum(cost)
    schedule = update - cost
    delivered = update + 1e-4 + 3e-5 * rng.random(num_steps)
    prompt = rng.integers(128, 2049, n)
    output = rng.integers(16, 401, n)
    tokenized = arrival + 3e-4 + 1e-6 * prompt
    enqueued = tokenized + 5e-5
    first = np.minimum(np.searchsorted(schedule, enqueued), num_steps - 1)
    preempted = rng.random(n) < 0.05
    cut = np.where(preempted, np.maximum(output // 2, 1), output)  # tokens of the first run
    gap = np.where(preempted, rng.integers(5, 200, n), 0)  # steps spent preempted
    last = first + output - 1 + gap
    keep = last < num_steps
    first, cut, gap, last = first[keep], cut[keep], gap[keep], last[keep]
    arrival, tokenized, enqueued = arrival[keep], tokenized[keep], enqueued[keep]
    prompt, output, preempted = prompt[keep], output[keep], preempted[keep]
    n = int(keep.sum())
    log = EventLog()
    log.req_ids = [str(i) for i in range(n)]
    req = {"arrival": arrival, "tokenized": tokenized, "enqueued": enqueued, "prompt": prompt,
           "first": first, "cut": cut, "gap": gap, "last": last, "preempted": preempted}
    _events(log, req, schedule, update, delivered)
    _runs(log, n, first, cut, gap, output, preempted)
    _steps(log, first, last, schedule, update, cost, delivered, rng)
    return log


def _events(log: EventLog, req: dict[str, np.ndarray], schedule: np.ndarray,
            update: np.ndarray, delivered: np.ndarray) -> None:
    """Stage events, written straight into the log's columns (a benchmark-only shortcut)."""
    arrival, tokenized, enqueued, prompt = (
        req[k] for k in ("arrival", "tokenized", "enqueued", "prompt"))
    first, cut, gap, last, preempted = (
        req[k] for k in ("first", "cut", "gap", "last", "preempted"))
    n = len(arrival)
    idx = np.arange(n)
    pre = np.flatnonzero(preempted)
    preempt_step = first[pre] + cut[pre]
    resume_step = first[pre] + cut[pre] + gap[pre]
    cols = [  # (kind, req, time, payload)
        (EventKind.ARRIVAL, idx, arrival, prompt),
        (EventKind.FRONTEND_START, idx, arrival, None),
        (EventKind.TOKENIZED, idx, tokenized, None),
        (EventKind.ENGINE_ENQUEUED, idx, enqueued, None),
        (EventKind.SCHEDULED, idx, schedule[first], np.zeros(n, dtype=np.int64)),
        (EventKind.FIRST_TOKEN, idx, update[first], None),
        (EventKind.PREEMPTED, pre, schedule[preempt_step], None),
        (EventKind.SCHEDULED, pre, schedule[resume_step], np.zeros(len(pre), dtype=np.int64)),
        (EventKind.FINISHED, idx, update[last], "length"),
        (EventKind.DELIVERED, idx, delivered[last], None),
    ]
    payload: list[Any] = []
    for kind, who, t, p in cols:
        _fill(log._ev_req, who)
        _fill(log._ev_kind, np.full(len(who), int(kind)))
        _fill(log._ev_time, t)
        if p is None or isinstance(p, str):
            payload.extend([p] * len(who))
        else:
            payload.extend(p.tolist())
    log._ev_payload = payload


def _runs(log: EventLog, n: int, first: np.ndarray, cut: np.ndarray, gap: np.ndarray,
          output: np.ndarray, preempted: np.ndarray) -> None:
    pre = np.flatnonzero(preempted)
    req = np.concatenate([np.arange(n), pre])
    start = np.concatenate([first, first[pre] + cut[pre] + gap[pre]])
    count = np.concatenate([cut, output[pre] - cut[pre]])
    _fill(log._run_req, req)
    _fill(log._run_first, start)
    _fill(log._run_count, count)


def _steps(log: EventLog, first: np.ndarray, last: np.ndarray, schedule: np.ndarray,
           update: np.ndarray, cost: np.ndarray, delivered: np.ndarray,
           rng: np.random.Generator) -> None:
    m = len(schedule)
    running = np.cumsum(np.bincount(first, minlength=m + 1)
                        - np.bincount(last + 1, minlength=m + 1))[:m]
    new = np.bincount(first, minlength=m)[:m]
    prefill_tokens = new * 700
    waiting = np.maximum(0, (running - running.mean()) // 4).astype(np.int64)
    kv = np.clip(running / max(running.max(), 1) * 1.02, 0, 1)
    blockers = np.where(kv >= 0.97, "kv_cache", np.where(new > 3, "token_budget", ""))
    cols: dict[str, Any] = {
        "step_id": np.arange(m), "schedule_time_s": schedule, "execute_start_s": schedule,
        "execute_end_s": update, "update_time_s": update, "num_reqs": running,
        "num_tokens": running - new + prefill_tokens, "num_prefill_reqs": new,
        "num_prefill_tokens": prefill_tokens, "num_decode_reqs": running - new,
        "decode_context_sum": (running - new) * 900, "num_sampled_tokens": running,
        "num_new_reqs": new, "num_resumed_reqs": np.zeros(m, dtype=np.int64),
        "num_preempted_reqs": (rng.random(m) < 0.001).astype(np.int64),
        "num_finished_reqs": np.bincount(last, minlength=m)[:m], "num_running": running,
        "num_waiting": waiting, "kv_usage": kv, "admission_blocker": blockers, "cost_s": cost,
        "replica": np.zeros(m, dtype=np.int64),  # one engine (if the log has this column)
    }
    log.record_steps(
        StepColumns.from_mapping({name: cols[name].tolist() for name in STEP_COLUMNS})
    )
    for step_id, t in zip(range(m), delivered.tolist(), strict=True):
        log.record_delivery(step_id, t)


def _timed(label: str, func: Callable[[], Any]) -> Any:
    """Run ``func``; print wall and CPU seconds (CPU is steadier on a shared machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = func()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{label:<26} wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak RSS {_peak_rss_mib():6.0f} MiB",
          flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=200.0, help="arrival rate (req/s)")
    ap.add_argument("--csv", action="store_true", help="also time writing the tables as CSV")
    args = ap.parse_args(argv)
    from reports import plots
    from reports.metrics import summarize
    from reports.run_dir import write_tables
    from reports.tables import build_columns

    log = _timed("synthetic EventLog", lambda: synthetic_log(args.num_requests, args.rate))
    runs = len(log.token_runs()["req_index"])
    print(f"  {len(log.req_ids):,} requests, {log.num_steps:,} steps, {runs:,} token runs")
    columns = _timed("build_columns", functools.partial(build_columns, log))
    del log
    meta = {"kind": "simulated", "config": {"model": "synthetic"}}
    summary = _timed("summarize", lambda: summarize(
        columns, meta, goodput={"ttft": 500, "tpot": 50}, percentiles=[50, 90, 99],
        percentile_metrics=["ttft", "tpot", "itl", "e2el"]))
    print(f"  p99 TTFT {summary['p99_ttft_ms']:.1f} ms, p99 ITL {summary['p99_itl_ms']:.1f} ms, "
          f"diagnosis {summary['diagnosis']['verdict']}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _timed("write tables (parquet)", lambda: write_tables(d, columns, "parquet"))
        tables = _timed("to DataFrames (plots, CSV)", columns.to_frames)
        _timed("plot latency_cdfs", lambda: plots.plot_latency_cdfs(tables, d / "a.png"))
        _timed("plot breakdown", lambda: plots.plot_breakdown(summary["breakdown"], d / "b.png"))
        _timed("plot kv_and_queues", lambda: plots.plot_kv_and_queues(tables, d / "c.png"))
        _timed("plot batch_composition",
               lambda: plots.plot_batch_composition(tables, d / "d.png", 8192))
        if args.csv:
            _timed("write tables (csv)", lambda: write_tables(d, tables, "csv"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
