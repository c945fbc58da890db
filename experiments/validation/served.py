"""``twinserve validate``'s whole loop on the served engine, as one call.

``validate_served`` starts the server (profiling inside it), measures through HTTP
(``online.measure``), stops it, joins every run with the server's records into run
directories, fits the step model (the profile's grid, wake-up probe and the calibration runs'
in-server steps) and the served path's costs (``served_costs``), simulates each load's
identical stream twice (``online_sim``) and writes the report (``online_report``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from experiments.validation.online import (
    Measurements,
    OnlinePlan,
    append_in_loop_rows,
    measure,
    pinned,
)

Log = Callable[[str], None]
REPORT_PERCENTILES = (50.0, 90.0, 99.0)


def _options() -> Any:
    from reports.options import SummaryOptions

    return SummaryOptions(percentiles=REPORT_PERCENTILES,
                          percentile_metrics=("ttft", "tpot", "itl", "e2el"))


def _tokenizer_dir(engine_args: Any) -> str | None:
    from engine.serve.frontend import Tokenizer

    path = engine_args.tokenizer or engine_args.model
    return str(path) if Tokenizer.has_tokenizer(path) else None


def run_server_and_measure(engine_args: Any, workload_cfg: Any, out: Path, plan: OnlinePlan,
                           *, profile_given: bool, log: Log) -> Measurements:
    """Start the server, measure everything through HTTP, stop it (its records written)."""
    from engine.worker.model_config import load_model_config
    from experiments.loadgen.bench import BenchOptions
    from experiments.validation.profiling import ProfileFiles
    from experiments.validation.served_engine import engine_info_path
    from experiments.validation.server import CpuLayout, ServerUnderTest, ServeSpec, serve_flags

    sched = engine_args.scheduler_config(load_model_config(engine_args.model))
    layout = CpuLayout.plan(plan.pin)
    files = ProfileFiles.of(out / "profile.csv")
    spec = ServeSpec(str(engine_args.model), tuple(serve_flags(engine_args)), out / "server",
                     None if profile_given else files.csv, plan.grid, out / "step_shapes.csv",
                     layout, plan.cpu_threads)
    log("starting twinserve serve" + ("" if profile_given else
                                      ", profiling inside its EngineCore process") + " …")
    server = ServerUnderTest(spec, log)
    try:
        info = json.loads(engine_info_path(spec.step_shapes).read_text())
        options = BenchOptions(base_url=server.url, tokenizer=_tokenizer_dir(engine_args),
                               continuous_usage=True, progress=False)
        with pinned(layout.client):
            m = measure(options, workload_cfg, plan, max_num_seqs=sched.max_num_seqs,
                        num_gpu_blocks=int(info["num_gpu_blocks"]),
                        block_size=int(info["block_size"]), log=log)
    except BaseException:
        server.kill()
        raise
    server.stop()
    return dataclasses.replace(m, layout=layout.describe())


def _join_all(m: Measurements, out: Path, plots: bool,
              engine_config: dict[str, Any]) -> dict[str, list[Path]]:
    """Every run's directory, joined with the server's records."""
    from experiments.loadgen.run_dir import ServerRecords, join_server_records, write_bench_run_dir

    records = ServerRecords.read(out / "server")
    options = _options()
    kw: dict[str, Any] = {"options": options, "file_format": "parquet",
                          "engine_config": engine_config}
    dirs: dict[str, list[Path]] = {}
    for c, record in m.calibration:
        d = out / "calibration" / f"c{c}"
        write_bench_run_dir(d, record, server=join_server_records(record, records),
                            plots=False, **kw)
    for load in m.loads:
        dirs[load.label] = []
        for k, record in enumerate(load.records):
            name = "measured" if k == 0 else f"measured_repeat{'' if k == 1 else k}"
            d = out / load.label / name
            write_bench_run_dir(d, record, server=join_server_records(record, records),
                                plots=plots and k == 0, **kw)
            dirs[load.label].append(d)
    return dirs


def _steps_of(run_dir: Path, samples: dict[int, Any]) -> list[Any]:
    from reports.run_dir import load_run_dir

    _, tables = load_run_dir(run_dir)
    return [samples[int(s)] for s in tables.steps["step_id"] if int(s) in samples]


#: The step model's fit weighs the steps the engine ran inside the server (calibration runs,
#: minutes before the measured ones, interleaved with real serving work) three times the grid
#: replays (profiled at start, back to back): on a shared host the machine's speed drifts
#: between the two, and the in-server steps are the better likeness of the measured runs.
SOURCE_SHARES = {"in_loop": 3.0, "step": 1.0}


def fit(out: Path, profile: Path, calibration: list[tuple[int, Path]], samples: dict[int, Any],
        log: Log, *, add_in_loop: bool) -> tuple[Any, Any]:
    """The fitted step model and the served path's costs (files beside the profile); with
    ``add_in_loop`` the calibration runs' in-server steps join the profile first."""
    from experiments.validation.profiling import ProfileFiles, fit_profile
    from experiments.validation.served_costs import ServedRun, fit_served_path

    files = ProfileFiles.of(profile)
    if add_in_loop:
        steps = [s for _, d in calibration for s in _steps_of(d, samples)]
        n = append_in_loop_rows(files.csv, steps)
        log(f"fit: the grid + {n} in-server steps of the calibration runs")
    model = fit_profile(files.csv, source_shares=SOURCE_SHARES)
    served = fit_served_path([(c, ServedRun.load(d)) for c, d in calibration])
    wake = model.frontend.wakeup
    served.save(out / "served_costs.json", idle_wakeup_s=wake.extra_s,
                idle_wakeup_ramp_s=wake.ramp_s)
    return model, served


def validate_served(engine_args: Any, workload_cfg: Any, out: Path, plan: OnlinePlan, *,
                    profile: Path | None, plots: bool, log: Log) -> dict[str, Any]:
    """The whole loop (see the module docstring); the summary of every load."""
    import numpy as np

    from engine.worker.model_config import load_model_config
    from experiments.validation.online_report import (
        compare_load,
        write_load_report,
        write_summary,
    )
    from experiments.validation.online_sim import simulate_fitted, simulate_replayed
    from experiments.validation.profiling import ProfileFiles
    from experiments.validation.report import step_time_errors
    from experiments.validation.runs import read_step_shapes
    from experiments.validation.served_costs import ServedRun

    if profile is not None and not ProfileFiles.of(profile).csv.exists():
        raise UserError(f"--profile {profile} does not exist")
    from engine.core.config import EngineConfig
    from experiments.run_meta import engine_config_dict

    m = run_server_and_measure(engine_args, workload_cfg, out, plan,
                               profile_given=profile is not None, log=log)
    sched = engine_args.scheduler_config(load_model_config(engine_args.model))
    engine_config = EngineConfig(sched, engine_args.engine.cache_config(m.num_gpu_blocks))
    dirs = _join_all(m, out, plots, engine_config_dict(engine_config))
    samples = {s.step_id: s for s in read_step_shapes(out / "step_shapes.csv")}
    calibration = [(c, out / "calibration" / f"c{c}") for c, _ in m.calibration]
    model, served = fit(out, profile or out / "profile.csv", calibration, samples, log,
                        add_in_loop=profile is None)
    fitted_path = ProfileFiles.of(profile or out / "profile.csv").fitted
    wake = model.frontend.wakeup
    frontend = served.frontend_config_values(wake.extra_s, wake.ramp_s)
    label = Path(engine_args.model).name
    results: dict[str, dict[str, Any]] = {}
    for load in m.loads:
        measured_dir = dirs[load.label][0]
        target = measured_dir.parent
        log(f"{load.label}: simulating the identical stream (fitted, replayed)")
        fitted = simulate_fitted(engine_config, load.workload, fitted_path, frontend,
                                 target / "simulated", model_label=label, plots=plots)
        run = ServedRun.load(measured_dir)
        record = load.records[0]
        first = min(o.start_time - o.client_queue_time for o in record.outputs)
        sends = np.maximum.accumulate([o.start_time - o.client_queue_time - first
                                       for o in record.outputs])
        # each request's own way in: client send -> sent to the engine, less the network
        req = run.tables.requests
        way_in = (req["tokenized_s"] - req["arrival_s"]).to_numpy(dtype=float)
        replayed = simulate_replayed(
            engine_config, load.workload, fitted_path, frontend, target / "replayed",
            steps=_steps_of(measured_dir, samples),
            request_frontend_s=np.maximum(way_in - float(frontend["network_latency_s"]), 0.0),
            send_times_s=sends, model_label=label, plots=plots)
        own = step_time_errors(model, _steps_of(measured_dir, samples))
        extra = {"load_fraction": load.fraction, "capacity_rps": m.capacity_rps,
                 "request_rate": load.workload.request_rate, "step_model_on_run": own}
        res = compare_load(load.label, load.records, measured_dir, replayed.run_dir,
                           fitted.run_dir, extra)
        write_load_report(target, res)
        results[load.label] = res
    header = {"model": str(engine_args.model), "device": engine_args.device,
              "capacity_rps": m.capacity_rps, "layout": m.layout,
              "served_costs": served.frontend_config_values(wake.extra_s, wake.ramp_s),
              "fit": model.fit_report.get("holdout"), "repeats": plan.repeats}
    write_summary(out, results, header)
    return {"header": header, "loads": results}
