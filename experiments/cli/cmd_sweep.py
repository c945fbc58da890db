"""``twinserve sweep FILE --out DIR``: every point of an experiment file, each simulated once.

Points already in ``DIR/cache`` are not run again (``--resume`` is the default), so adding a
point to the file and rerunning runs only the new point. ``--jobs N`` runs N local processes;
``--backend ray`` runs the same tasks on Ray (a local one, or ``--ray-address`` to join a
cluster). Writes ``results.parquet``/``.csv`` (one row per point), ``summary.md`` and comparison
plots; see experiments/sweep/report.py and docs/experiments.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _sweep(args: argparse.Namespace) -> int:
    from experiments.sweep.backends import make_backend, running, worker_count
    from experiments.sweep.expfile import expand_points, load_experiment, with_base_overrides
    from experiments.sweep.report import (
        aggregate,
        markdown_table,
        open_sweep_dir,
        run_experiment,
    )
    from experiments.sweep.runner import ProgressLine

    spec = with_base_overrides(load_experiment(args.file), args.set or [])
    if args.dry_run:
        points = expand_points(spec)  # validate everything; nothing runs
        print(f"{spec.name}: {len(points)} point(s) valid "
              f"({len(spec.variants)} variant(s) × {len(points) // len(spec.variants)})")
        return 0
    out = open_sweep_dir(Path(args.out) if args.out else Path("runs") / f"sweep-{spec.name}")
    with out:
        points = expand_points(spec)  # validate everything before starting any worker
        _check_memory(points, worker_count(args.backend, args.jobs))
        with running(make_backend(args.backend, args.jobs, args.ray_address)) as backend:
            progress = ProgressLine() if args.progress else None
            outcome = run_experiment(
                spec, out, backend, resume=args.resume, save_runs=args.save_runs,
                plots=not args.no_plots, progress=progress, points=points,
            )
    s = outcome.stats
    print(markdown_table(aggregate(outcome.table, outcome.x)))
    speed = (f", {s.sims_per_minute:.1f} simulations/min on {s.workers} worker(s)"
             if s.num_run else "")
    print(f"{s.num_tasks} point(s): {s.num_run} run, {s.num_cached} cached"
          f"{f', {s.num_failed} FAILED' if s.num_failed else ''}{speed}", file=sys.stderr)
    if s.num_failed:
        errors = outcome.table.loc[outcome.table["error"].notna(), ["point", "series", "error"]]
        for row in errors.itertuples(index=False):
            print(f"  point {row.point} ({row.series}): {row.error}", file=sys.stderr)
    print(f"Results: {out.requested / 'results.parquet'} (+ .csv, summary.md, plots/)",
          file=sys.stderr)
    return 1 if s.num_failed else 0


def _check_memory(points: list[Any], workers: int) -> None:
    """Refuse a sweep whose largest points, run ``workers`` at a time, need more memory than
    this machine has."""
    from experiments.resources import check_simulation_memory
    from sim.config import SimConfig

    if points:
        largest = max(points, key=lambda p: p.config["workload"]["num_prompts"])
        check_simulation_memory(SimConfig.from_dict(dict(largest.config)),
                                parallel=min(workers, len(points)))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="run every point of an experiment file (cached, parallel, or on Ray)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="experiment file (TOML or JSON): [base], [grid], [[variant]], "
                   "[report]")
    p.add_argument("--out", help="output directory (default runs/sweep-<name>)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a base key (repeatable), e.g. --set num_prompts=200")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="parallel simulations (default: all CPUs; 1 = in this process)")
    p.add_argument("--backend", choices=["process", "ray"], default="process",
                   help="process: a local process pool (default); ray: Ray tasks")
    p.add_argument("--ray-address", help="join this Ray cluster (e.g. auto, ray://host:10001) "
                   "instead of starting a local Ray")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse cached points (default); --no-resume reruns all of them")
    p.add_argument("--save-runs", action="store_true",
                   help="also write a full run directory per point under DIR/runs/ (slower)")
    p.add_argument("--no-plots", action="store_true", help="skip the comparison plots")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the file and count its points; run nothing")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress on stderr (default on)")
    p.set_defaults(func=_sweep)
