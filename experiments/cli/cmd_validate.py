"""``twinserve profile`` and ``twinserve validate``: fit a cost model to the real engine, then
check the simulator against a measured run of the same workload (``experiments.validation``).

``validate`` writes, per load, the measured run directory, the simulated one, ``compare/``,
``validation.json``, ``validation.md`` and ``step_time_scatter.png``; with ``--loads`` one
sub-directory per load and a summary table at the top. The report itself is written by
``experiments.validation.report``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import ConfigError
from engine.core.errors import UserError
from experiments.validation.report import error_table, write_validation

DEFAULT_WORKLOAD = {"dataset_name": "random", "num_prompts": 200, "random_input_len": 128,
                    "random_output_len": 32, "random_range_ratio": 0.5}
#: The loads of a validation without --loads: light, medium and heavy (of measured capacity).
LOADS = (0.15, 0.5, 0.85)


def _engine_args(args: argparse.Namespace) -> Any:
    from experiments.cli.flags import engine_args_from_flags

    if not args.model:
        raise ConfigError("--model is required (unless --reuse-measured is given)")
    return engine_args_from_flags(args)


def _threads(args: argparse.Namespace) -> None:
    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def _profile(args: argparse.Namespace) -> int:
    from experiments.validation.profiling import ProfileFiles, fit_profile, profile_engine

    if args.refit:
        model = fit_profile(args.out, holdout_fraction=args.holdout, seed=args.seed,
                            statistic=args.statistic)
    else:
        _threads(args)
        model = profile_engine(_engine_args(args), args.out, grid=args.grid,
                               holdout_fraction=args.holdout, seed=args.seed,
                               statistic=args.statistic, log=_log)
    print(json.dumps({"fitted": str(ProfileFiles.of(args.out).fitted), "fit": model.fit_report,
                      "coefficients": model.coefficients,
                      "linear_knee_tokens": model.linear_knee_tokens,
                      "frontend_config": model.frontend.frontend_config_values()}, indent=1))
    return 0


def _workload_config(args: argparse.Namespace, rate: float | None) -> Any:
    from experiments.simconfig import workload_dict_from_args
    from workload.config import WorkloadConfig

    values = workload_dict_from_args(args)
    if rate is not None:
        values["request_rate"] = rate
    return WorkloadConfig(**values)


def _validate(args: argparse.Namespace) -> int:
    from experiments.cli.reporting import prepare_out_dir

    out = prepare_out_dir(Path(args.out))
    if args.reuse_measured:
        return _validate_reused(args, out)
    if args.in_process:
        return _validate_in_process(args, out)
    return _validate_served(args, out)


def _validate_served(args: argparse.Namespace, out: Path) -> int:
    """The online path: ``twinserve serve`` measured by ``bench serve`` (the default)."""
    from experiments.validation.online import OnlinePlan
    from experiments.validation.online_report import load_table
    from experiments.validation.served import validate_served

    engine_args = _engine_args(args)
    loads = ((None,) if args.load_fraction is None and not args.loads
             and args.request_rate is not None
             else tuple(float(x) for x in args.loads.split(",")) if args.loads
             else (args.load_fraction,) if args.load_fraction is not None else LOADS)
    plan = OnlinePlan(loads=loads, repeats=args.repeats, grid=args.grid,
                      calibration_levels=tuple(int(c) for c in args.calibration.split(",")),
                      calibration_prompts_per_level=args.calibration_prompts, pin=args.pin,
                      cpu_threads=args.cpu_threads)
    workload_cfg = _workload_config(args, None)
    result = validate_served(engine_args, workload_cfg, out, plan,
                             profile=Path(args.profile) if args.profile else None,
                             plots=not args.no_plots, log=_log)
    print("\n".join(load_table(result["loads"])))
    print(f"\nvalidation report: {out / 'validation.md'}", file=sys.stderr)
    return 0


def _validate_in_process(args: argparse.Namespace, out: Path) -> int:
    """The in-process loop of ``run-real`` (no API server, no IPC): ``--in-process``."""
    from experiments.run_meta import engine_config_dict
    from experiments.validation import profiling, runs
    from sim.cost.fitted import FittedCostModel
    from workload.build import build_workload

    _threads(args)
    engine_args = _engine_args(args)
    profile = Path(args.profile) if args.profile else out / "profile.csv"
    files = profiling.ProfileFiles.of(profile)
    workload_cfg = _workload_config(args, None)
    if not files.csv.exists():
        w = build_workload(workload_cfg)
        calib = profiling.CalibrationSpec(input_len=round(float(np.mean(w.prompt_lens))),
                                          output_len=round(float(np.mean(w.output_lens))))
        profiling.profile_engine(engine_args, files.csv, grid=args.grid, calibration=calib,
                                 log=_log)
    elif not files.fitted.exists():
        profiling.fit_profile(files.csv)
    model = FittedCostModel.load(files.fitted)
    engine = engine_args.build()
    model_capacity = runs.capacity_rps(model, build_workload(workload_cfg),
                                       engine_config_dict(engine.engine_config),
                                       mode=args.frontend_mapping)
    capacity = model_capacity
    if args.capacity == "measured":
        capacity = runs.measure_capacity_rps(engine, workload_cfg)
    _log(f"capacity: measured {capacity:.1f} req/s, the fitted model's estimate "
         f"{model_capacity:.1f} req/s" if args.capacity == "measured" else
         f"capacity: the fitted model's estimate {capacity:.1f} req/s")
    loads = [float(x) for x in args.loads.split(",")] if args.loads else [args.load_fraction]
    results: dict[str, dict[str, Any]] = {}
    for frac in loads:
        rate = None if frac is None else frac * capacity
        label = "given rate" if frac is None else f"{frac:.0%} of capacity"
        target = out if len(loads) == 1 else out / f"load-{frac:g}"
        _log(f"{label}: request rate {rate or args.request_rate} req/s")
        measured = [runs.serve_measured(engine, _workload_config(args, rate),
                                        model.measured_on.get("speed_probe_s"))
                    for _ in range(args.repeats)]
        results[label] = _compare_one(measured, files.fitted, target, args,
                                      {"capacity_rps": capacity, "load_fraction": frac,
                                       "capacity_source": args.capacity,
                                       "model_capacity_rps": model_capacity})
    _summary(results, out, capacity, f"({args.capacity})")
    return 0


def _compare_one(measured: Sequence[Any], fitted: Path, target: Path,
                 args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    from experiments.validation import runs

    target.mkdir(parents=True, exist_ok=True)
    plots = not args.no_plots
    runs.write_measured(measured[0], target / "measured", plots=plots)
    repeat = None
    if len(measured) > 1:
        repeat = runs.write_measured(measured[1], target / "measured_repeat", plots=False)
    runs.simulate_like(measured[0].meta, fitted, target / "simulated", plots=plots,
                       mode=args.frontend_mapping)
    corrected = None
    drift = measured[0].meta["stats"].get("speed_drift")
    if args.speed_correct and drift:
        corrected = runs.simulate_like(measured[0].meta, fitted,
                                       target / "simulated_speed_corrected", plots=False,
                                       mode=args.frontend_mapping, scale=drift)
    extra = {**extra, "request_rate": measured[0].meta["config"]["workload"]["request_rate"]}
    return write_validation(target / "measured", target / "simulated", fitted, target,
                            plots=plots, extra=extra, repeat_dir=repeat,
                            corrected_dir=corrected)


def _validate_reused(args: argparse.Namespace, out: Path) -> int:
    """Measured runs from elsewhere: bundle JSON files (``bench/gpu_validate.py``) or run
    directories."""
    from experiments.validation import profiling, runs

    src = Path(args.reuse_measured)
    bundles = sorted(src.glob("measured_*.json")) if src.is_dir() else [src]
    if src.is_dir() and (src / "config.json").exists():
        bundles = [src]
    profile = Path(args.profile) if args.profile else (src if src.is_dir() else src.parent) / (
        "profile.csv")
    files = profiling.ProfileFiles.of(profile)
    if not files.fitted.exists():
        profiling.fit_profile(files.csv)
    if not bundles:
        raise ConfigError(f"{src} holds no measured_*.json bundle and is no run directory")
    results = {}
    for b in bundles:
        target = out if len(bundles) == 1 else out / b.stem
        if b.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            meta = json.loads((b / "config.json").read_text())
            runs.simulate_like(meta, files.fitted, target / "simulated",
                               plots=not args.no_plots, mode=args.frontend_mapping)
            results[b.name] = write_validation(b, target / "simulated", files.fitted, target,
                                               plots=not args.no_plots)
        else:
            run = runs.read_bundle(b)
            extra = {k: run.meta.get(k)
                     for k in ("capacity_rps", "load_fraction", "model_capacity_rps")}
            results[b.stem] = _compare_one([run], files.fitted, target, args, extra)
    _summary(results, out, None)
    return 0


def _summary(results: dict[str, dict[str, Any]], out: Path, capacity: float | None,
             capacity_source: str = "") -> None:
    from reports.meta import write_json

    table = error_table(results)
    fixed = error_table(results, "speed_corrected")
    if len(results) > 1:
        write_json(out / "validation_summary.json", {"capacity_rps": capacity, "loads": results})
        notes = [f"- **{load}**: " + " ".join(r["diagnosis"]) for load, r in results.items()]
        cap = "–" if capacity is None else f"{capacity:.1f} req/s"
        head = ["# Validation at several loads", "",
                f"Capacity the loads refer to: {cap} {capacity_source}".rstrip(),
                "", "rel err = (simulated − measured) / measured; in parentheses the run-to-run "
                "difference of two measured runs (the noise floor).", ""]
        extra = (["", "With the cost model scaled by each run's speed drift:", "", *fixed]
                 if len(fixed) > 2 else [])
        body = [*head, *table, *extra, "", "## Which stage misses, and why", "", *notes]
        (out / "validation.md").write_text("\n".join(body) + "\n")
    if len(fixed) > 2:
        print("\nscaled by each run's speed drift:\n" + "\n".join(fixed))
    print("\n".join(table))


def register(sub: Any) -> None:
    from experiments.cli.flags import add_engine_flags, add_workload_flags

    p = sub.add_parser("profile", help="profile the real engine's step times and CPU stages; "
                       "fit a cost model (profile.csv → profile.fitted.json)",
                       description=__doc__)
    add_engine_flags(p)
    p.add_argument("--out", required=True, help="profile CSV path (X.meta.json and "
                   "X.fitted.json are written next to it)")
    p.add_argument("--grid", choices=["full", "quick", "gpu"], default="full")
    p.add_argument("--holdout", type=float, default=0.2, help="fraction of rows held out")
    p.add_argument("--statistic", choices=["mean", "median"], default="mean",
                   help="each row's target in the fit (default mean: latencies add up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--refit", action="store_true", help="only refit an existing profile CSV")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch CPU threads (default 1; 0: torch's own default)")
    p.set_defaults(func=_profile)
    _optional_model(p)

    p = sub.add_parser("validate", help="serve a model for real (twinserve serve), profile "
                       "it in place, drive it with bench serve at three loads, simulate each "
                       "identical stream and report the simulator's errors per metric and stage",
                       description=__doc__)
    add_engine_flags(p)
    add_workload_flags(p)
    p.set_defaults(**DEFAULT_WORKLOAD)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--profile", help="reuse this profile CSV (default: OUT/profile.csv, "
                   "profiled if missing)")
    p.add_argument("--grid", choices=["full", "quick", "gpu"], default="full")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--load-fraction", type=float,
                   help="request rate = this × the engine's estimated capacity")
    g.add_argument("--loads", help="several load fractions, e.g. 0.15,0.5,0.85")
    p.add_argument("--capacity", choices=["measured", "model"], default="measured",
                   help="what load fractions refer to: a quick saturation run of the real "
                   "engine (default) or the fitted model's estimate")
    p.add_argument("--reuse-measured", help="a measured-run bundle JSON, a directory of them "
                   "(with profile.csv) or a run directory: simulate and compare only")
    p.add_argument("--repeats", type=int, default=2,
                   help="measured runs of each load's identical stream (default 2: the "
                   "run-to-run difference is the noise floor reported beside every error)")
    p.add_argument("--in-process", action="store_true",
                   help="validate the in-process loop of run-real instead of the served path "
                   "(no API server, no IPC: the earlier validation)")
    p.add_argument("--calibration", default="1,4,16,64",
                   help="concurrencies of the calibration runs through the server (1,4,16,64)")
    p.add_argument("--calibration-prompts", type=int, default=3,
                   help="calibration requests per level: max(8, this × concurrency) (3)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="pin the EngineCore and the API server to separate CPUs (and the load "
                   "generator beside the API server) where there are two or more")
    p.add_argument("--speed-correct", action=argparse.BooleanOptionalAction, default=False,
                   help="also simulate with the model scaled by the run's speed drift (the "
                   "probe steps' time around the run / during the profile) and report both")
    p.add_argument("--frontend-mapping", choices=["in_process", "stages"], default="in_process")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch CPU threads (default 1; 0: torch's own default)")
    p.set_defaults(func=_validate)
    _optional_model(p)


def main(argv: Sequence[str] | None = None) -> int:
    """``profile``/``validate`` alone (scripts and tests; ``twinserve`` has them too)."""
    parser = argparse.ArgumentParser(prog="twinserve")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2


def _optional_model(p: argparse.ArgumentParser) -> None:
    for action in p._actions:
        if action.dest == "model":
            action.required = False
