"""``twinserve run-real``: serve a workload for real (wall clock) and write the same run directory
and report as ``twinserve simulate``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.cli.flags import (
    add_cpu_threads_flag,
    add_engine_flags,
    add_report_flags,
    add_workload_flags,
    default_out_dir,
    engine_args_from_flags,
    positive_float,
    set_cpu_threads,
)
from experiments.simconfig import workload_dict_from_args


def _run_real(args: argparse.Namespace) -> int:
    import time

    from engine.serve.real_run import run_real, stream_info
    from experiments.cli.reporting import FinishedRun, open_out_dir, report_options, write_run
    from experiments.run_meta import measured_run_meta
    from workload.build import build_workload
    from workload.config import WorkloadConfig

    workload_cfg = WorkloadConfig(**workload_dict_from_args(args))
    workload = build_workload(workload_cfg)
    check_wall_clock_span(workload, args.max_arrival_span)
    options = report_options(args)  # parsed now: a bad flag fails before the run
    engine_args = engine_args_from_flags(args)
    with open_out_dir(Path(args.out) if args.out else default_out_dir("real")) as out:
        set_cpu_threads(args.cpu_threads)
        engine = engine_args.build(stream=stream_info(workload, workload_cfg.seed))
        t0 = time.perf_counter()
        try:
            result = run_real(engine, workload, seed=workload_cfg.seed)
        finally:
            engine.executor.shutdown()  # stops the worker processes of a TP/PP layout
        meta = measured_run_meta(engine, workload_cfg, workload, result,
                                 time.perf_counter() - t0)
        run = FinishedRun(meta, result.event_log)
        del result
        # no report process: importing the report stack would take CPU from the measured run
        write_run(run, out, args, options)
    print(f"measured {len(workload)} requests in {meta.stats.wall_time_s:.1f} s "
          f"on {meta.device}", file=sys.stderr)
    return 0


def check_wall_clock_span(workload: Any, limit_s: float) -> None:
    """Refuse a workload whose arrivals span more wall-clock time than ``limit_s``: a real
    run waits for every arrival (a trace with a day-long gap takes a day)."""
    from engine.core.errors import UserError

    span = float(workload.send_time_s[-1]) if len(workload) else 0.0
    if span > limit_s:
        raise UserError(
            f"the workload's arrivals span {_duration(span)} of wall-clock time, and a real run "
            f"waits for each of them (--max-arrival-span is {_duration(limit_s)}): replay the "
            "trace faster with --trace-time-scale, raise --request-rate, use fewer "
            "--num-prompts, or raise --max-arrival-span"
        )


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds:,.0f} s"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run-real",
        help="serve a workload with the real engine in wall-clock time; writes a report",
        description=__doc__,
    )
    add_engine_flags(p, parallel=True)
    add_cpu_threads_flag(p)
    p.add_argument("--max-arrival-span", type=positive_float, default=3600.0, metavar="S",
                   help="refuse a workload whose arrivals span more than S seconds of wall "
                   "clock (default 3600)")
    add_workload_flags(p)
    add_report_flags(p, "real")
    p.set_defaults(func=_run_real)
