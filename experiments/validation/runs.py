"""Closing the loop: measured runs of the real engine and the simulated runs that replay them
(``twinserve validate``; profiling is ``experiments.validation.profiling``).

* ``serve_measured`` — ``run_real`` on the workload: a run directory plus ``step_shapes.csv``
  (the executor's full batch shape and measured time of every step);
* ``simulate_like`` — the identical request stream (same workload config and seed) through the
  simulator with the fitted cost model, the measured run's engine config (KV blocks, budgets,
  chunking, prefix caching, sync scheduling) and the front-end costs mapped onto
  ``FrontendConfig`` (``FrontendCosts.frontend_config_values``);
* ``measure_capacity_rps`` / ``capacity_rps`` — the highest rate the real engine and the fitted
  model sustain;
* ``experiments.validation.report.write_validation`` — the comparison, ``validation.json`` and
  ``validation.md``.

A measured run can also arrive as one *bundle* JSON (``write_bundle``: meta, event log, step
shapes) — what ``bench/gpu_validate.py`` saves on a GPU machine without the simulator.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import ConfigError
from engine.core.events import EventKind, EventLog, StepColumns
from engine.core.outputs import BatchShape
from experiments.validation.profiling import plain_json
from sim.cost.fitted import FittedCostModel
from workload.build import build_workload
from workload.config import WorkloadConfig
from workload.stream import Workload

STEP_SHAPE_COLUMNS = ("step_id", "num_reqs", "num_tokens", "prefill_query_lens",
                      "prefill_context_lens", "num_decode_reqs", "decode_context_sum",
                      "decode_context_max", "num_sampling_reqs", "execute_time_s")


def step_shape_rows(timings: Sequence[Any]) -> list[dict[str, Any]]:
    rows = []
    for t in timings:
        s = t.batch_shape
        rows.append({
            "step_id": t.step_id, "num_reqs": s.num_reqs, "num_tokens": s.num_tokens,
            "prefill_query_lens": ";".join(map(str, s.prefill_query_lens)),
            "prefill_context_lens": ";".join(map(str, s.prefill_context_lens)),
            "num_decode_reqs": s.num_decode_reqs, "decode_context_sum": s.decode_context_sum,
            "decode_context_max": s.decode_context_max,
            "num_sampling_reqs": s.num_sampling_reqs, "execute_time_s": t.execute_time_s,
        })
    return rows


def write_step_shapes(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(STEP_SHAPE_COLUMNS))
        w.writeheader()
        w.writerows(rows)


@dataclass(frozen=True, slots=True)
class StepSample:
    """One executed step of a measured run: its full shape and measured time."""

    step_id: int
    shape: BatchShape
    execute_time_s: float


def shapes_from_rows(rows: Sequence[dict[str, Any]]) -> list[StepSample]:
    """The steps that computed tokens (``step_shapes.csv`` rows or bundle rows)."""
    def ints(v: Any) -> tuple[int, ...]:
        return tuple(int(x) for x in str(v).split(";") if x != "")

    out = []
    for r in rows:
        shape = BatchShape(int(r["num_reqs"]), int(r["num_tokens"]),
                           ints(r["prefill_query_lens"]), ints(r["prefill_context_lens"]),
                           int(r["num_decode_reqs"]), int(r["decode_context_sum"]),
                           int(r["decode_context_max"]), int(r["num_sampling_reqs"]))
        if shape.num_tokens:
            out.append(StepSample(int(r["step_id"]), shape, float(r["execute_time_s"])))
    return out


def read_step_shapes(path: Path) -> list[StepSample]:
    with path.open(newline="") as f:
        return shapes_from_rows(list(csv.DictReader(f)))


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """A served workload: its metadata, event log and executed step shapes."""

    meta: dict[str, Any]
    log: EventLog
    step_rows: list[dict[str, Any]]


def serve_measured(engine: Any, workload_cfg: WorkloadConfig,
                   reference_probe_s: float | None = None) -> MeasuredRun:
    """``run_real`` on ``workload_cfg`` with an already built engine (warms up first),
    between two speed probes; ``speed_drift`` = their mean / ``reference_probe_s`` (the
    profile's): how much slower the machine ran the same fixed steps during this run."""
    from engine.serve.real_run import run_real
    from engine.worker.profiler import speed_probe
    from experiments.run_meta import measured_run_meta

    workload = build_workload(workload_cfg)
    probe_before = speed_probe(engine.executor)
    engine.executor.step_timings.clear()
    cpu0, t0 = time.thread_time(), time.perf_counter()
    result = run_real(engine, workload, seed=workload_cfg.seed)
    cpu_s, wall_s = time.thread_time() - cpu0, time.perf_counter() - t0
    meta = measured_run_meta(engine, workload_cfg, workload, result, wall_s)
    num_steps = result.event_log.num_steps
    timings = engine.executor.step_timings[-num_steps:] if num_steps else []
    if [t.step_id for t in timings] != list(range(num_steps)):
        raise RuntimeError("the executor's step timings do not line up with the run's steps")
    rows = step_shape_rows(timings)
    probe = (probe_before + speed_probe(engine.executor)) / 2
    stats = dataclasses.replace(
        meta.stats, thread_cpu_s=cpu_s, cpu_share=cpu_share(result.event_log, cpu_s),
        speed_probe_s=probe, speed_drift=probe / reference_probe_s if reference_probe_s else None,
    )
    meta = dataclasses.replace(meta, stats=stats, label="measured")
    return MeasuredRun(plain_json(meta.to_dict()), result.event_log, rows)


def cpu_share(log: EventLog, cpu_s: float) -> float | None:
    """Thread CPU time / busy wall time of the loop (1.0: the loop had its core throughout;
    lower: other processes took it). Busy = from each schedule() to the next one, except
    idle waits (gaps longer than 5 ms after a step's outputs)."""
    steps = log.steps_columns()
    t = np.asarray(steps["schedule_time_s"])
    if len(t) < 2:
        return None
    gaps = np.diff(t)
    end = np.asarray(steps["update_time_s"])[:-1]
    busy = float(np.sum(np.where(t[1:] - end > 5e-3, end - t[:-1], gaps)))
    return min(cpu_s / busy, 1.0) if busy > 0 else None


def write_measured(run: MeasuredRun, out_dir: Path, *, plots: bool) -> Path:
    """The measured run's directory, with the shapes of the steps it executed
    (``step_shapes.csv``), written whole."""
    from reports.run_dir import open_run_dir, write_run_files
    from reports.tables import build_tables
    from reports.written import commit_run

    with open_run_dir(out_dir, "run directory") as out:
        written = write_run_files(out.staging, build_tables(run.log), run.meta, plots=plots,
                                  percentile_metrics=("ttft", "tpot", "itl", "e2el"))
        write_step_shapes(out.staging / "step_shapes.csv", run.step_rows)
        commit_run(out, written)
    return out_dir


# -- bundles: a measured run as one JSON (no pandas needed to write it) -------------------------
def dump_event_log(log: EventLog) -> dict[str, Any]:
    ev = log.events_columns()
    return {
        "req_ids": list(log.req_ids),
        "events": {k: list(v) for k, v in ev.items()},  # type: ignore[call-overload]
        "token_runs": {k: list(v) for k, v in log.token_runs().items()},
        "steps": {k: list(v) for k, v in log.steps_columns().items()},  # type: ignore[call-overload]
        "delivered": [[k, v] for k, v in log.delivered_times().items()],
    }


def load_event_log(values: dict[str, Any]) -> EventLog:
    """The inverse of ``dump_event_log`` (same tables, token runs closed)."""
    log = EventLog()
    ids = values["req_ids"]
    for rid in ids:
        log.index_of(rid)
    ev = values["events"]
    for r, k, t, p in zip(ev["req_index"], ev["kind"], ev["time_s"], ev["payload"], strict=True):
        log.record(ids[r], EventKind(k), t, p)
    if values["steps"]["step_id"]:
        log.record_steps(StepColumns.from_mapping(values["steps"]))
    runs = values["token_runs"]
    for r, first, count in zip(runs["req_index"], runs["first_step"], runs["num_tokens"],
                               strict=True):
        log.record_tokens(ids[r], first, count)
        log.close_request(ids[r])
    for step_id, t in values["delivered"]:
        log.record_delivery(int(step_id), t)
    return log


def write_bundle(run: MeasuredRun, path: Path) -> Path:
    from engine.output_dir import atomic_write_text

    return atomic_write_text(path, json.dumps({
        "format": "twinserve-measured-run/1", "meta": run.meta,
        "event_log": dump_event_log(run.log), "step_shapes": run.step_rows}) + "\n")


def read_bundle(path: Path) -> MeasuredRun:
    """A measured-run bundle (``write_bundle``); a file that is not one is a ``ConfigError``
    naming it."""
    from engine.paths import read_text

    try:
        values = json.loads(read_text(path, "measured-run bundle"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a measured-run bundle: not JSON ({exc})") from None
    if not isinstance(values, dict) or values.get("format") != "twinserve-measured-run/1":
        raise ConfigError(f"{path} is not a measured-run bundle (no "
                          "format: twinserve-measured-run/1)")
    try:
        return MeasuredRun(values["meta"], load_event_log(values["event_log"]),
                           values["step_shapes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: a damaged measured-run bundle ({type(exc).__name__}: "
                          f"{exc})") from None


# -- the simulated run ---------------------------------------------------------------------------
def workload_config_of(meta: dict[str, Any]) -> WorkloadConfig:
    values = dict(meta["config"]["workload"])
    values["request_rate"] = float(values["request_rate"])
    values["priority_mix"] = tuple(tuple(p) for p in values.get("priority_mix") or ())
    return WorkloadConfig(**values)


def sim_config_like(meta: dict[str, Any], fitted_path: Path, *, mode: str = "in_process",
                    model: FittedCostModel | None = None) -> Any:
    """The ``SimConfig`` of the measured run: its engine config exactly (KV blocks, budgets,
    chunking, prefix caching, scheduling), its workload and seed, the fitted cost model and the
    mapped front-end costs. ``model``/``gpu`` stay catalogue labels: with ``num_gpu_blocks``
    and ``max_model_len`` given the catalogs are not consulted, so they carry the measured
    run's checkpoint and device as labels."""
    from engine.core.config import EngineKnobs
    from sim.config import FrontendConfig, SimConfig

    sched = meta["engine_config"]["scheduler"]
    cache = meta["engine_config"]["cache"]
    fitted = model or FittedCostModel.load(fitted_path)
    workload = workload_config_of(meta)
    return SimConfig(
        model=str(meta.get("model_id", "measured-model")), gpu=str(meta.get("device", "cpu")),
        num_gpu_blocks=cache["num_gpu_blocks"], max_model_len=sched["max_model_len"],
        engine=EngineKnobs(
            max_num_batched_tokens=sched["max_num_batched_tokens"],
            max_num_seqs=sched["max_num_seqs"],
            enable_chunked_prefill=sched["enable_chunked_prefill"],
            long_prefill_token_threshold=sched["long_prefill_token_threshold"],
            policy=sched["policy"], scheduler_reserve_full_isl=sched["scheduler_reserve_full_isl"],
            async_scheduling=sched["async_scheduling"], block_size=cache["block_size"],
            enable_prefix_caching=cache["enable_prefix_caching"], watermark=cache["watermark"],
        ),
        frontend=FrontendConfig(**fitted.frontend.frontend_config_values(
            mode, float(np.mean(build_workload(workload).output_lens)))),
        workload=workload, cost_model=f"fitted:{fitted_path}",
    )


def simulate_like(meta: dict[str, Any], fitted_path: Path, out_dir: Path, *, plots: bool,
                  mode: str = "in_process", scale: float = 1.0) -> Path:
    """Simulate the measured run's request stream; writes the simulated run directory.
    ``scale`` != 1 runs the model scaled by that factor (``FittedCostModel.scaled``)."""
    from experiments.run_meta import simulated_run_meta
    from reports.run_dir import write_run_dir
    from sim.runtime import SimRuntime

    model = FittedCostModel.load(fitted_path)
    if scale != 1.0:
        model = model.scaled(scale)
    cfg = sim_config_like(meta, fitted_path, mode=mode, model=model)
    workload = build_workload(cfg.workload)
    result = SimRuntime(cfg, workload=workload, cost_model=model).run()
    sim_meta = dataclasses.replace(
        simulated_run_meta(result),
        label="simulated" if scale == 1.0 else "simulated (speed-corrected)",
        notes={"frontend_mapping": mode, "cost_model_scale": scale},
    )
    write_run_dir(out_dir, result.event_log, sim_meta, plots=plots,
                  percentile_metrics=("ttft", "tpot", "itl", "e2el"))
    return out_dir


# -- capacity ------------------------------------------------------------------------------------
def measure_capacity_rps(engine: Any, workload_cfg: WorkloadConfig, *,
                         rounds: float = 3.0) -> float:
    """The engine's saturation request rate on this workload's lengths, measured: a burst of
    ``rounds`` × (the most requests the engine runs at once) requests sent at t = 0 (a seed of
    its own); completions per second between the 20th and the 80th percentile completion,
    where the batch is full. Loads defined against it do not depend on the model under test."""
    from engine.serve.real_run import run_real

    sched = engine.engine_config.scheduler
    cache = engine.engine_config.cache
    probe = build_workload(workload_cfg)
    per_req = math.ceil(float(np.mean(probe.prompt_lens + probe.output_lens)) / cache.block_size)
    batch = max(1, min(sched.max_num_seqs, (cache.num_gpu_blocks - 1) // per_req))
    cfg = dataclasses.replace(workload_cfg, num_prompts=max(16, int(rounds * batch)),
                              request_rate=math.inf, max_concurrency=None,
                              seed=workload_cfg.seed + 7_919)
    log = run_real(engine, build_workload(cfg), seed=cfg.seed).event_log
    ev = log.events_columns()
    kinds = np.asarray(ev["kind"])
    done = np.sort(np.asarray(ev["time_s"])[kinds == int(EventKind.DELIVERED)])
    lo, hi = int(0.2 * len(done)), int(0.8 * len(done))
    if hi <= lo or done[hi] <= done[lo]:
        return float(len(done) / max(done[-1], 1e-9))
    return float((hi - lo) / (done[hi] - done[lo]))



def capacity_rps(model: FittedCostModel, workload: Workload, engine_config: dict[str, Any],
                 *, mode: str = "in_process") -> float:
    """Saturation request rate of the engine on this workload's mean lengths (analytic, from
    the fitted model): at ``B`` running requests an iteration holds ``B/out`` new prefills and
    ``B (1 − 1/out)`` decodes and completes ``B/out`` requests; capacity is the best rate over
    the batch sizes the engine allows (max_num_seqs, the KV blocks, the token budget)."""
    sched, cache = engine_config["scheduler"], engine_config["cache"]
    i = float(np.mean(workload.prompt_lens))
    o = max(float(np.mean(workload.output_lens)), 1.0)
    fe = model.frontend.frontend_config_values(mode, o)
    per_req_blocks = math.ceil((i + o) / cache["block_size"])
    b_max = min(sched["max_num_seqs"], (cache["num_gpu_blocks"] - 1) // per_req_blocks)
    best = 0.0
    for b in range(1, max(b_max, 1) + 1):
        new = b / o
        tokens = b - new + new * i
        if tokens > sched["max_num_batched_tokens"]:
            break
        step = model.time_of(b, round(tokens), b, new * model.attention_flops(i, 0.0),
                             round((b - new) * (i + o / 2.0)))
        loop = (fe["schedule_overhead_s"] + fe["schedule_s_per_request"] * b
                + fe["update_overhead_s"])
        best = max(best, new / (step + loop))
    return best
