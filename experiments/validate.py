"""Closing the loop: profile the real engine, fit a cost model, simulate the same workload, and
compare with the measured run (``twinserve profile`` / ``twinserve validate``).

The pieces, each usable alone:

* ``profile_engine`` — the model-step grid (``engine.worker.profiler.StepProfiler``), the
  front-end callables (``frontend_rows``: request admission, tokenize, detokenize), the first
  step after the loop idled (``wakeup_rows``) and the
  engine loop's own CPU stages, taken from a short *calibration* run of the real loop on a
  workload of its own seed (``loop_rows``: schedule, post-step output processing, loop top);
  writes ``profile.csv``, ``profile.meta.json`` and the fitted ``profile.fitted.json``;
* ``run_measured`` — ``run_real`` on the workload, a run directory plus ``step_shapes.csv``
  (the executor's full batch shape and measured time of every step);
* ``simulate_like`` — the identical request stream (same workload config and seed) through the
  simulator with the fitted cost model, the measured run's engine config (KV blocks, budgets,
  chunking, prefix caching, sync scheduling) and the front-end costs mapped onto
  ``FrontendConfig`` (``FrontendCosts.frontend_config_values``);
* ``experiments.cmd_validate.write_validation`` — the comparison, ``validation.json`` and
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import ConfigError
from engine.core.events import EventKind, EventLog
from engine.core.outputs import BatchShape
from sim.cost.fitted import FittedCostModel, ModelGeometry, read_profile_csv
from workload.build import build_workload
from workload.config import WorkloadConfig
from workload.stream import Workload

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ProfileFiles:
    """A profile's three files: ``X.csv``, ``X.meta.json`` and ``X.fitted.json``."""

    csv: Path
    meta: Path
    fitted: Path

    @staticmethod
    def of(csv_path: str | Path) -> ProfileFiles:
        p = Path(csv_path)
        stem = p.with_suffix("") if p.suffix == ".csv" else p
        return ProfileFiles(stem.with_suffix(".csv"), Path(f"{stem}.meta.json"),
                            Path(f"{stem}.fitted.json"))


@dataclass(frozen=True, slots=True)
class CalibrationSpec:
    """Calibration runs of the engine loop: closed-loop runs at a few concurrency levels, so
    the loop's CPU stages are seen at every batch size a validation run reaches (sizes are
    fitted with equal weight: the small batches of light loads count as much as big ones)."""

    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    prompts_per_level: int = 2  # requests per run = max(8, this × concurrency)
    input_len: int = 64
    output_len: int = 32
    seed: int = 1_000_003  # never a validation workload's seed

    def workload_configs(self, max_num_seqs: int) -> list[WorkloadConfig]:
        levels = sorted({min(c, max_num_seqs) for c in self.concurrencies})
        return [
            WorkloadConfig(dataset_name="random", num_prompts=max(8, self.prompts_per_level * c),
                           request_rate=math.inf, max_concurrency=c,
                           random_input_len=self.input_len, random_output_len=self.output_len,
                           random_range_ratio=0.5, seed=self.seed + c)
            for c in levels
        ]


# -- profiling -----------------------------------------------------------------------------------
def make_grid(name: str, engine_args: Any, seed: int = 0) -> Any:
    """The profile grid ``name`` ("full" or "quick") within the engine's limits."""
    from engine.worker.model_config import load_model_config
    from engine.worker.profiler import ProfileGrid, quick_grid

    sched = engine_args.scheduler_config(load_model_config(engine_args.model))
    limits = {"max_num_batched_tokens": sched.max_num_batched_tokens,
              "max_num_seqs": sched.max_num_seqs, "max_model_len": sched.max_model_len,
              "seed": seed}
    if name == "quick":
        return quick_grid(**limits)  # type: ignore[arg-type]
    if name == "full":
        return ProfileGrid(rounds=5, **limits)  # type: ignore[arg-type]
    if name == "gpu":  # Llama-3.1-8B-sized steps on one H200: a couple of minutes
        return ProfileGrid(
            prefill_query_lens=(64, 256, 1024, 2048, 4096, 8192), prefill_context_lens=(0, 2048),
            prefill_batch_sizes=(1, 2), decode_batch_sizes=(1, 8, 32, 64, 128, 256),
            decode_context_lens=(128, 640, 2048), mixed_decode_batch_sizes=(8, 64, 128),
            mixed_query_lens=(256, 2048), rounds=3, **limits)  # type: ignore[arg-type]
    raise ConfigError(f"unknown profile grid {name!r}: use full, quick or gpu")


def model_geometry(engine: Any) -> ModelGeometry:
    c = engine.model_config
    return ModelGeometry(c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                         c.num_key_value_heads, c.head_dim, c.intermediate_size, c.vocab_size,
                         int(engine.executor.dtype.itemsize))


def profile_engine(
    engine_args: Any,
    csv_path: str | Path,
    *,
    grid: str = "full",
    calibration: CalibrationSpec | None = None,
    holdout_fraction: float = 0.2,
    seed: int = 0,
    statistic: str = "mean",
    log: Log = _quiet,
) -> FittedCostModel:
    """Profile, calibrate the loop, fit; writes the three ``ProfileFiles``; the fitted model."""
    import torch

    from engine.serve.real_run import run_real
    from engine.worker.profiler import StepProfiler, speed_probe, write_profile_csv
    from experiments.provenance import provenance

    calibration = calibration or CalibrationSpec()
    files = ProfileFiles.of(csv_path)
    the_grid = make_grid(grid, engine_args, seed)
    block_size = engine_args.block_size
    calib_blocks = max(calibration.concurrencies) * (
        -(-(2 * calibration.input_len + 2 * calibration.output_len) // block_size))
    blocks = max(the_grid.num_blocks(block_size), calib_blocks + 1)
    engine = dataclasses.replace(engine_args, num_gpu_blocks=blocks, kv_cache_memory=None).build()
    t0 = time.perf_counter()
    log(f"profiling {len(the_grid.shapes())} step shapes × {the_grid.rounds} rounds "
        f"on {engine.executor.device} …")
    probes = [speed_probe(engine.executor)]
    rows = StepProfiler(engine.executor).profile(the_grid)
    t_grid = time.perf_counter() - t0
    rows += frontend_rows(engine)
    log("timing the first step after the engine loop idled …")
    rows += wakeup_rows(engine, the_grid)
    log("calibrating the engine loop on real runs …")
    logs = []
    for w in calibration.workload_configs(the_grid.max_num_seqs):
        engine.executor.step_timings.clear()
        logs.append(run_real(engine, build_workload(w), seed=w.seed).event_log)
        rows += in_loop_rows(engine.executor.step_timings[-logs[-1].num_steps:])
    rows += loop_rows(logs)
    probes.append(speed_probe(engine.executor))
    write_profile_csv(files.csv, rows)
    geometry = model_geometry(engine)
    ratios = [r.stats.cpu_ratio for r in rows if r.shape is not None]
    meta = {
        "model": str(engine_args.model), "device": str(engine.executor.device),
        "dtype": str(engine.executor.dtype).removeprefix("torch."),
        "attention_backend": engine.executor.attention_backend,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "geometry": dataclasses.asdict(geometry), "grid": grid,
        "grid_params": dataclasses.asdict(the_grid), "grid_seconds": t_grid,
        "calibration": dataclasses.asdict(calibration),
        "cpu_ratio_median": float(np.nanmedian(ratios)) if ratios else None,
        "speed_probe_s": float(np.mean(probes)), "speed_probes_s": probes,
        "engine_args": {k: getattr(engine_args, k) for k in engine_args.__dataclass_fields__},
        **provenance(),
    }
    files.meta.write_text(json.dumps(_jsonable(meta), indent=1) + "\n")
    engine.executor.shutdown()
    model = fit_profile(files.csv, holdout_fraction=holdout_fraction, seed=seed,
                        statistic=statistic)
    log(f"profile: {files.csv} ({len(rows)} rows, {time.perf_counter() - t0:.0f} s)")
    return model


def fit_profile(csv_path: str | Path, *, holdout_fraction: float = 0.2, seed: int = 0,
                statistic: str = "mean") -> FittedCostModel:
    """Fit ``X.csv`` with the geometry of ``X.meta.json``; saves ``X.fitted.json``."""
    files = ProfileFiles.of(csv_path)
    try:
        meta = json.loads(files.meta.read_text())
    except OSError:
        raise ConfigError(f"{files.meta} is missing: it holds the profiled model's geometry; "
                          "profile again with twinserve profile") from None
    measured_on = {k: meta.get(k) for k in ("model", "device", "dtype", "attention_backend",
                                             "torch", "torch_threads", "date", "git_commit",
                                             "cpu_ratio_median", "speed_probe_s")}
    measured_on["profile"] = files.csv.name
    model = FittedCostModel.fit(read_profile_csv(files.csv), ModelGeometry(**meta["geometry"]),
                                holdout_fraction=holdout_fraction, seed=seed,
                                measured_on=measured_on, statistic=statistic)
    model.save(files.fitted)
    return model


def frontend_rows(engine: Any, *, repeats: int = 7) -> list[Any]:
    """Per-request admission (what ``run_real`` does per arrival: validate, build, register
    with the output processor and the core), tokenize and detokenize costs."""
    from engine.core.engine_core import EngineCore
    from engine.core.request import SamplingParams
    from engine.serve.frontend import IncrementalDetokenizer
    from engine.serve.output_processor import OutputProcessor
    from engine.worker.profiler import time_unit_costs

    max_len = engine.engine_config.scheduler.max_model_len - 1
    sizes = sorted({min(n, max_len) for n in (16, 64, 256, 1024)})
    rng = np.random.default_rng(0)
    vocab = engine.model_config.vocab_size
    prompts = {n: rng.integers(min(16, vocab - 1), vocab, n).tolist() for n in sizes}
    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    core = EngineCore(engine.engine_config)
    processor = OutputProcessor(engine.tokenizer)
    counter = iter(range(1 << 62))

    def admit(n: int) -> None:
        req_id = f"admit-{next(counter)}"
        request = engine.make_request(req_id, prompts[n], params, arrival_time=0.0)
        processor.add_request(req_id, None, prompts[n], params)
        core.add_request(request, 0.0)

    rows = time_unit_costs("frontend", "admit", admit, sizes, repeats=repeats, inner=4)
    tokenizer = engine.tokenizer
    if tokenizer is not None:
        texts = {n: tokenizer.decode(prompts[n]) for n in sizes}
        encoded = {len(tokenizer.encode(t)): t for t in texts.values()}
        rows += time_unit_costs("frontend", "tokenize", lambda n: tokenizer.encode(encoded[n]),
                                sorted(encoded), repeats=repeats)

        def detokenize(n: int) -> None:
            detok = IncrementalDetokenizer(tokenizer, prompts[sizes[0]])
            for t in prompts[max(sizes)][:n]:
                detok.add_tokens([t])

        rows += time_unit_costs("frontend", "detokenize", detokenize,
                                [s for s in sizes if s <= len(prompts[max(sizes)])],
                                repeats=repeats)
    return rows


def wakeup_rows(engine: Any, grid: Any) -> list[Any]:
    """The wake-up probe (``StepProfiler.measure_wakeup``): a lone prompt of up to 128 tokens
    (within the grid's limits) after each idle duration, and back to back."""
    from engine.worker.profiler import WAKEUP_QUERY_LEN, ShapeSpec, StepProfiler

    query_len = min(WAKEUP_QUERY_LEN, grid.max_num_batched_tokens, grid.max_model_len - 2)
    spec = ShapeSpec("prefill", ((max(1, query_len), 0),), ())
    return StepProfiler(engine.executor).measure_wakeup(spec, seed=grid.seed)


def step_kind(shape: BatchShape) -> str:
    """"decode", "prefill" or "mixed": what a step's batch holds."""
    if not shape.prefill_query_lens:
        return "decode"
    return "prefill" if not shape.num_decode_reqs else "mixed"


def in_loop_rows(timings: Sequence[Any]) -> list[Any]:
    """Step rows named ``in_loop``: every step a calibration run executed, with its measured
    time — the model step as it runs inside the real loop (caches shared with the scheduler
    and the output path), next to the grid's back-to-back replays."""
    from engine.worker.profiler import ProfileRow, SampleStats

    rows = []
    for t in timings:
        s = t.batch_shape
        if s.num_tokens:
            rows.append(ProfileRow(step_kind(s), "in_loop", s, s.num_tokens,
                                   SampleStats.of([t.execute_time_s])))
    return rows


def loop_rows(logs: Sequence[EventLog]) -> list[Any]:
    """The engine loop's CPU stages from real runs' step records, one row per sizes:
    ``schedule`` (begin_step → execute start; scheduled, new requests), ``post`` (execute end
    → delivery: update_from_output + output processing; output tokens, finished requests) and
    ``gap`` (delivery → next begin_step; arrivals admitted in between)."""
    from engine.worker.profiler import stats_row

    groups: dict[tuple[str, int, int], list[float]] = {}
    for log in logs:
        _loop_samples(log, groups)
    return [stats_row("loop", name, size, values, size2)
            for (name, size, size2), values in sorted(groups.items())]


def _loop_samples(log: EventLog, groups: dict[tuple[str, int, int], list[float]]) -> None:
    steps = log.steps_columns()
    col = {k: np.asarray(steps[k]) for k in (
        "step_id", "schedule_time_s", "execute_start_s", "execute_end_s", "num_reqs",
        "num_new_reqs", "num_sampled_tokens", "num_finished_reqs")}
    sched_t = col["schedule_time_s"]
    delivered = log.delivered_times()
    ev = log.events_columns()
    kinds = np.asarray(ev["kind"])
    enq = np.sort(np.asarray(ev["time_s"])[kinds == int(EventKind.ENGINE_ENQUEUED)])

    def add(name: str, size: int, size2: int, value: float) -> None:
        groups.setdefault((name, int(size), int(size2)), []).append(float(value))

    for i in range(len(sched_t)):
        add("schedule", col["num_reqs"][i], col["num_new_reqs"][i],
            col["execute_start_s"][i] - sched_t[i])
        d = delivered.get(int(col["step_id"][i]))
        if d is None:
            continue
        add("post", col["num_sampled_tokens"][i], col["num_finished_reqs"][i],
            d - col["execute_end_s"][i])
        if i + 1 < len(sched_t):
            arrivals = int(np.searchsorted(enq, sched_t[i + 1], "right")
                           - np.searchsorted(enq, d, "right"))
            add("gap", arrivals, 0, sched_t[i + 1] - d)


# -- the measured run ----------------------------------------------------------------------------
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
    from experiments.cmd_run_real import real_meta

    workload = dataclasses.replace(build_workload(workload_cfg),
                                   extra={"seed": workload_cfg.seed})
    probe_before = speed_probe(engine.executor)
    engine.executor.step_timings.clear()
    cpu0, t0 = time.thread_time(), time.perf_counter()
    result = run_real(engine, workload, seed=workload_cfg.seed)
    cpu_s, wall_s = time.thread_time() - cpu0, time.perf_counter() - t0
    meta = real_meta(engine, workload, result, wall_s)
    meta["config"]["workload"] = dataclasses.asdict(workload_cfg)
    num_steps = result.event_log.num_steps
    timings = engine.executor.step_timings[-num_steps:] if num_steps else []
    if [t.step_id for t in timings] != list(range(num_steps)):
        raise RuntimeError("the executor's step timings do not line up with the run's steps")
    rows = step_shape_rows(timings)
    probe = (probe_before + speed_probe(engine.executor)) / 2
    meta["stats"]["thread_cpu_s"] = cpu_s
    meta["stats"]["cpu_share"] = cpu_share(result.event_log, cpu_s)
    meta["stats"]["speed_probe_s"] = probe
    meta["stats"]["speed_drift"] = probe / reference_probe_s if reference_probe_s else None
    meta["label"] = "measured"
    return MeasuredRun(_jsonable(meta), result.event_log, rows)


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
    from reports.run_dir import write_run_dir

    write_run_dir(out_dir, run.log, run.meta, plots=plots,
                  percentile_metrics=("ttft", "tpot", "itl", "e2el"))
    write_step_shapes(out_dir / "step_shapes.csv", run.step_rows)
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
        log.record_steps(values["steps"])
    runs = values["token_runs"]
    for r, first, count in zip(runs["req_index"], runs["first_step"], runs["num_tokens"],
                               strict=True):
        log.extend_runs_from([ids[r]], [first], [count])
        log.close_request(ids[r])
    for step_id, t in values["delivered"]:
        log.record_delivery(int(step_id), t)
    return log


def write_bundle(run: MeasuredRun, path: Path) -> Path:
    path.write_text(json.dumps({"format": "twinserve-measured-run/1", "meta": run.meta,
                                "event_log": dump_event_log(run.log),
                                "step_shapes": run.step_rows}) + "\n")
    return path


def read_bundle(path: Path) -> MeasuredRun:
    values = json.loads(path.read_text())
    if values.get("format") != "twinserve-measured-run/1":
        raise ConfigError(f"{path} is not a measured-run bundle")
    return MeasuredRun(values["meta"], load_event_log(values["event_log"]),
                       values["step_shapes"])


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
    from sim.config import EngineKnobs, FrontendConfig, SimConfig

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
    from experiments.cmd_sim import run_meta
    from reports.run_dir import write_run_dir
    from sim.runtime import SimRuntime

    model = FittedCostModel.load(fitted_path)
    if scale != 1.0:
        model = model.scaled(scale)
    cfg = sim_config_like(meta, fitted_path, mode=mode, model=model)
    workload = build_workload(cfg.workload)
    result = SimRuntime(cfg, workload=workload, cost_model=model).run()
    sim_meta = run_meta(result)
    sim_meta["label"] = "simulated" if scale == 1.0 else "simulated (speed-corrected)"
    sim_meta["frontend_mapping"] = mode
    sim_meta["cost_model_scale"] = scale
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


def _jsonable(value: Any) -> Any:
    from reports.meta import to_jsonable

    return json.loads(json.dumps(to_jsonable(value)))
