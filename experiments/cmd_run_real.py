"""``twinserve run-real``: serve a workload for real (wall clock) and write the same run directory
and report as ``twinserve simulate``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.cmd_real import _add_engine_args, _engine_kwargs
from experiments.cmd_sim import add_report_flags, default_out_dir
from experiments.simconfig_cli import add_workload_flags, workload_dict_from_args


def engine_config_dict(engine_config: Any) -> dict[str, dict[str, Any]]:
    """An ``EngineConfig`` as config.json keeps it: {"scheduler": {...}, "cache": {...}}."""
    sched, cache = engine_config.scheduler, engine_config.cache
    return {
        "scheduler": {k: getattr(sched, k) for k in sched.__dataclass_fields__},
        "cache": {k: getattr(cache, k) for k in cache.__dataclass_fields__},
    }


def real_meta(engine: Any, workload: Any, result: Any, wall_s: float) -> dict[str, Any]:
    """config.json content of a measured run."""
    from experiments.provenance import provenance

    return {
        "kind": "real",
        "config": {"engine_args": {k: getattr(engine.args, k)
                                   for k in engine.args.__dataclass_fields__}},
        "engine_config": engine_config_dict(engine.engine_config),
        "model_id": str(engine.args.model),
        "device": str(engine.executor.device),
        "attention_backend": engine.executor.attention_backend,
        "num_api_servers": 1,
        "seed": int(workload.extra.get("seed", 0)),
        "workload": {
            "source": workload.source,
            "num_prompts": len(workload),
            "request_rate": workload.request_rate,
            "burstiness": workload.burstiness,
            "max_concurrency": workload.max_concurrency,
        },
        "stats": {
            "num_requests": len(workload),
            "num_rejected": result.num_rejected,
            "num_steps": result.event_log.num_steps,
            "wall_time_s": wall_s,
            "simulated_time_s": result.wall_time_s,
            "api_server_busy_s": 0.0,
            "output_processor_busy_s": 0.0,
        },
        "reject_reasons": result.reject_reasons,
        **provenance(),
    }


def _run_real(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from engine.llm import EngineArgs
    from engine.serve.real_run import run_real
    from experiments.reporting import finish_run, prepare_out_dir, report_options
    from workload.build import build_workload
    from workload.config import WorkloadConfig

    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)
    workload_cfg = WorkloadConfig(**workload_dict_from_args(args))
    workload = build_workload(workload_cfg)
    workload = dataclasses.replace(workload, extra={"seed": workload_cfg.seed})
    options = report_options(args)  # parsed now: a bad flag fails before the run
    out_dir = prepare_out_dir(Path(args.out) if args.out else default_out_dir("real"))
    engine = EngineArgs(model=args.model, **_engine_kwargs(args)).build()
    t0 = time.perf_counter()
    result = run_real(engine, workload, seed=workload_cfg.seed)
    meta = real_meta(engine, workload, result, time.perf_counter() - t0)
    meta["config"]["workload"] = {
        k: getattr(workload_cfg, k) for k in workload_cfg.__dataclass_fields__
    }
    from reports.tables import build_tables

    finish_run(tables=build_tables(result.event_log), meta=meta, out_dir=out_dir, args=args,
               options=options)
    print(f"measured {len(workload)} requests in {meta['stats']['wall_time_s']:.1f} s "
          f"on {meta['device']}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run-real",
        help="serve a workload with the real engine in wall-clock time; writes a report",
        description=__doc__,
    )
    _add_engine_args(p)
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch CPU threads (default 1: steadier step times on small machines; "
                   "0 = torch's default)")
    add_workload_flags(p)
    add_report_flags(p, "real")
    p.set_defaults(func=_run_real)
