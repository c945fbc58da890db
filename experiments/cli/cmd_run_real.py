"""``twinserve run-real``: serve a workload for real (wall clock) and write the same run directory
and report as ``twinserve simulate``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.cli.flags import (
    add_engine_flags,
    add_report_flags,
    add_workload_flags,
    default_out_dir,
    engine_args_from_flags,
)
from experiments.simconfig import workload_dict_from_args


def _run_real(args: argparse.Namespace) -> int:
    import time

    from engine.serve.real_run import run_real, stream_info
    from experiments.cli.reporting import FinishedRun, prepare_out_dir, report_options, write_run
    from experiments.run_meta import measured_run_meta
    from workload.build import build_workload
    from workload.config import WorkloadConfig

    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)
    workload_cfg = WorkloadConfig(**workload_dict_from_args(args))
    workload = build_workload(workload_cfg)
    options = report_options(args)  # parsed now: a bad flag fails before the run
    out_dir = prepare_out_dir(Path(args.out) if args.out else default_out_dir("real"))
    engine = engine_args_from_flags(args).build(stream=stream_info(workload, workload_cfg.seed))
    t0 = time.perf_counter()
    try:
        result = run_real(engine, workload, seed=workload_cfg.seed)
    finally:
        engine.executor.shutdown()  # stops the worker processes of a TP/PP layout
    meta = measured_run_meta(engine, workload_cfg, workload, result, time.perf_counter() - t0)
    run = FinishedRun(meta, result.event_log)
    del result
    # no report process: importing the report stack would take CPU from the measured run
    write_run(run, out_dir, args, options)
    print(f"measured {len(workload)} requests in {meta.stats.wall_time_s:.1f} s "
          f"on {meta.device}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run-real",
        help="serve a workload with the real engine in wall-clock time; writes a report",
        description=__doc__,
    )
    add_engine_flags(p, parallel=True)
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch CPU threads (default 1: steadier step times on small machines; "
                   "0 = torch's default)")
    add_workload_flags(p)
    add_report_flags(p, "real")
    p.set_defaults(func=_run_real)
