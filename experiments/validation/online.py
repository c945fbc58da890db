"""``twinserve validate`` on the real online path: measure a running server, fit, simulate.

One ``twinserve serve`` process tree (``experiments.validation.server``) serves everything,
pinned where the host allows:

1. **profile** — inside the EngineCore process, before the first request: the step grid, the
   wake-up and speed probes (``experiments.validation.served_engine``);
2. **calibrate** — closed-loop ``bench serve`` runs at a few concurrencies (seeds of their own,
   the validation workload's mean lengths), whose stage records give the served path's costs
   (``served_costs``) and whose steps, as the engine ran them, join the grid in the fit;
3. **capacity** — a burst of requests at t = 0: completions per second between the 20th and
   80th percentile completion, where the batch is full;
4. **measure** — the validation workload at each load (a fraction of that capacity), each run
   ``repeats`` times (the noise floor), each repeat with its own prompt tokens (same lengths and
   arrivals, no prefix-cache hit across runs), an idle gap before each;

then the server stops (its records are written), every run is joined with them into a run
directory, the cost model is fitted, and ``online_sim`` / ``online_report`` simulate and
compare. Files under ``OUT``: ``profile.csv`` (+ ``.meta.json``, ``.fitted.json``),
``served_costs.json``, ``step_shapes.csv``, ``server/`` (the server's own run directory and
records), ``calibration/c<N>/``, ``load-<f>/measured``, ``load-<f>/measured_repeat`` ….
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.errors import UserError
from experiments.loadgen.bench import BenchOptions, run_bench
from experiments.loadgen.run_dir import BenchRecord
from workload.config import WorkloadConfig

Log = Callable[[str], None]
CALIBRATION_SEED = 1_000_003  # never a validation workload's seed
TOKEN_SEED = 7_000_000  # prompt tokens of measured run k: TOKEN_SEED + k


@dataclass(frozen=True, slots=True)
class OnlinePlan:
    """What ``validate`` measures, and how."""

    loads: tuple[float | None, ...]  # fractions of the measured capacity (None: the given rate)
    repeats: int = 2
    grid: str = "full"
    calibration_levels: tuple[int, ...] = (1, 4, 16, 64)
    calibration_prompts_per_level: int = 3  # requests per level: max(8, this × concurrency)
    capacity_rounds: float = 3.0
    pin: bool = True
    cpu_threads: int = 1
    idle_gap_s: float = 0.5

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise UserError(f"--repeats must be >= 1, got {self.repeats}")
        if any(f is not None and not 0 < f <= 2 for f in self.loads):
            raise UserError(f"load fractions must be in (0, 2], got {self.loads}")


@dataclass(frozen=True, slots=True)
class MeasuredLoad:
    """The measured runs of one load: the same stream, ``repeats`` times."""

    label: str  # "load-0.5" or "given-rate"
    fraction: float | None
    workload: WorkloadConfig
    records: list[BenchRecord]


@dataclass(frozen=True, slots=True)
class Measurements:
    """Everything the server served, as the client saw it (joined afterwards)."""

    calibration: list[tuple[int, BenchRecord]]
    capacity_rps: float
    loads: list[MeasuredLoad]
    num_gpu_blocks: int
    layout: str


def calibration_workloads(levels: Sequence[int], per_level: int, input_len: int,
                          output_len: int, max_num_seqs: int) -> list[tuple[int, WorkloadConfig]]:
    """Closed-loop runs at each concurrency (capped by ``max_num_seqs``)."""
    out = []
    for c in sorted({min(c, max_num_seqs) for c in levels}):
        out.append((c, WorkloadConfig(
            dataset_name="random", num_prompts=max(8, per_level * c), request_rate=math.inf,
            max_concurrency=c, random_input_len=input_len, random_output_len=output_len,
            random_range_ratio=0.5, seed=CALIBRATION_SEED + c)))
    return out


def capacity_rps(record: BenchRecord) -> float:
    """Completions per second while the batch is full: between the 20th and the 80th
    percentile completion of a burst sent at t = 0."""
    done = np.sort([o.start_time + o.latency for o in record.outputs if o.success])
    if len(done) < 2:
        raise UserError("the capacity burst completed fewer than two requests")
    lo, hi = int(0.2 * len(done)), int(0.8 * len(done))
    if hi <= lo or done[hi] <= done[lo]:
        return float(len(done) / max(done[-1] - record.start_s, 1e-9))
    return float((hi - lo) / (done[hi] - done[lo]))


@contextlib.contextmanager
def pinned(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """This process (the load generator) on ``cpus`` for the block's duration."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def measure(options: BenchOptions, workload_cfg: WorkloadConfig, plan: OnlinePlan,
            *, max_num_seqs: int, num_gpu_blocks: int, block_size: int,
            log: Log) -> Measurements:
    """Calibrate, find the capacity, measure every load (see the module docstring)."""
    from workload.build import build_workload

    probe = build_workload(workload_cfg)
    mean_in = round(float(np.mean(probe.prompt_lens)))
    mean_out = round(float(np.mean(probe.output_lens)))
    calibration = []
    for c, cfg in calibration_workloads(plan.calibration_levels,
                                        plan.calibration_prompts_per_level, mean_in, mean_out,
                                        max_num_seqs):
        log(f"calibration: {cfg.num_prompts} requests at concurrency {c}")
        calibration.append((c, run_bench(dataclasses.replace(
            options, request_id_prefix=f"calib-c{c}-"), cfg)))
    per_req = math.ceil((mean_in + mean_out) / block_size)
    batch = max(1, min(max_num_seqs, (num_gpu_blocks - 1) // max(per_req, 1)))
    burst = dataclasses.replace(workload_cfg, num_prompts=max(16, int(plan.capacity_rounds
                                                                       * batch)),
                                request_rate=math.inf, max_concurrency=None,
                                seed=workload_cfg.seed + 7_919, ramp_up_strategy=None,
                                ramp_up_start_rps=None, ramp_up_end_rps=None)
    log(f"capacity: a burst of {burst.num_prompts} requests")
    capacity = capacity_rps(run_bench(dataclasses.replace(options, request_id_prefix="capacity-"),
                                      burst))
    log(f"capacity: {capacity:.1f} req/s")
    loads = []
    run_index = 0
    for fraction in plan.loads:
        cfg = workload_cfg if fraction is None else dataclasses.replace(
            workload_cfg, request_rate=fraction * capacity)
        label = "given-rate" if fraction is None else f"load-{fraction:g}"
        records = []
        for k in range(plan.repeats):
            time.sleep(plan.idle_gap_s)
            log(f"{label}: run {k + 1}/{plan.repeats} at {cfg.request_rate:.2f} req/s")
            records.append(run_bench(dataclasses.replace(
                options, request_id_prefix=f"{label}-r{k}-", token_seed=TOKEN_SEED + run_index),
                cfg))
            run_index += 1
        loads.append(MeasuredLoad(label, fraction, cfg, records))
    return Measurements(calibration, capacity, loads, num_gpu_blocks, "")


def append_in_loop_rows(profile_csv: Path, samples: Sequence[Any]) -> int:
    """The calibration runs' steps, as the engine ran them inside the server, appended to the
    profile as ``in_loop`` rows (one sample each); the number of rows."""
    from engine.worker.profiler import PROFILE_COLUMNS, ProfileRow, SampleStats
    from experiments.validation.profiling import step_kind

    rows = [ProfileRow(step_kind(s.shape), "in_loop", s.shape, s.shape.num_tokens,
                       SampleStats.of([s.execute_time_s])) for s in samples]
    with profile_csv.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(PROFILE_COLUMNS))
        writer.writerows(r.to_csv_dict() for r in rows)
    return len(rows)
