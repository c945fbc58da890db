"""Profiling the real engine for a fitted cost model (``twinserve profile``, and the first
stage of ``twinserve validate``).

``profile_engine`` times the model-step grid (``engine.worker.profiler.StepProfiler``), the
front-end callables (``frontend_rows``: request admission, tokenize, detokenize), the first step
after the loop idled (``wakeup_rows``) and the engine loop's own CPU stages, taken from a short
*calibration* run of the real loop on a workload of its own seed (``loop_rows``: schedule,
post-step output processing, loop top); it writes ``profile.csv``, ``profile.meta.json`` and the
fitted ``profile.fitted.json`` (``ProfileFiles``). ``fit_profile`` refits a profile on disk.
"""

from __future__ import annotations

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
    block_size = engine_args.engine.block_size
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
        **dataclasses.asdict(provenance()),
    }
    files.meta.write_text(json.dumps(plain_json(meta), indent=1) + "\n")
    engine.executor.shutdown()
    model = fit_profile(files.csv, holdout_fraction=holdout_fraction, seed=seed,
                        statistic=statistic)
    log(f"profile: {files.csv} ({len(rows)} rows, {time.perf_counter() - t0:.0f} s)")
    return model


def fit_profile(csv_path: str | Path, *, holdout_fraction: float = 0.2, seed: int = 0,
                statistic: str = "mean",
                source_shares: dict[str, float] | None = None) -> FittedCostModel:
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
                                measured_on=measured_on, statistic=statistic,
                                source_shares=source_shares)
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


def plain_json(value: Any) -> Any:
    """``value`` as plain JSON types (numpy values, dataclasses and paths converted)."""
    from reports.meta import to_jsonable

    return json.loads(json.dumps(to_jsonable(value)))
