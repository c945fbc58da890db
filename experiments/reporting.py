"""The common tail of every run (simulated or real): write the run directory and print results.

Parses the vllm-bench-style result flags (``--goodput KEY:MS …``, ``--metric-percentiles``,
``--percentile-metrics``) and hands the event log to ``reports.run_dir.write_run_dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError

if TYPE_CHECKING:
    from reports.tables import RunTables

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_goodput(items: list[str] | None) -> dict[str, float] | None:
    """``["ttft:500", "tpot:50"]`` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    if not items:
        return None
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise UserError(
                f"invalid --goodput entry {item!r}: use KEY:MS with KEY in "
                f"{', '.join(GOODPUT_KEYS)}"
            )
        try:
            ms = float(value)
        except ValueError:
            raise UserError(f"invalid --goodput value in {item!r}: not a number") from None
        if ms < 0:
            raise UserError(f"invalid --goodput value in {item!r}: must be >= 0")
        out[key] = ms
    return out


def parse_percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UserError(f"invalid --metric-percentiles {text!r}: comma-separated numbers") from None
    if not values or any(not 0 < p < 100 for p in values):
        raise UserError(f"invalid --metric-percentiles {text!r}: each must be in (0, 100)")
    return values


def parse_metrics(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in PERCENTILE_METRICS]
    if bad or not names:
        raise UserError(
            f"invalid --percentile-metrics {text!r}: choose from {', '.join(PERCENTILE_METRICS)}"
        )
    return names


def prepare_out_dir(path: Path) -> Path:
    """Create the output directory before any work starts, so that an ``--out`` that cannot be
    one (an existing file, a path under a file, an unwritable place) is refused at once
    instead of after a long run."""
    try:
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {path} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. a path under a file, no permission, a name too long
        raise UserError(
            f"cannot create the output directory {path}: {exc.strerror or exc}"
        ) from None
    if not os.access(path, os.W_OK):
        raise UserError(f"the output directory {path} is not writable")
    return path


def finish_run(
    *, tables: RunTables, meta: dict[str, Any], out_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Write the run directory (tables, summary, report) and print the summary.

    Takes the tables (``reports.tables.build_tables(log)``) rather than the event log, so a
    caller can let go of a large log before the report is rendered.
    """
    from reports.errors import ReportError
    from reports.metrics import format_summary
    from reports.run_dir import write_run_dir_from_tables

    try:
        summary = write_run_dir_from_tables(
            out_dir,
            tables,
            meta,
            goodput=parse_goodput(args.goodput),
            percentiles=parse_percentiles(args.metric_percentiles),
            percentile_metrics=parse_metrics(args.percentile_metrics),
            plots=not args.no_plots,
            file_format=args.format,
        )
    except ReportError as exc:
        raise UserError(str(exc)) from None
    print(format_summary(summary))
    diagnosis = summary.get("diagnosis")
    if isinstance(diagnosis, dict) and diagnosis.get("text"):
        print(f"\nDiagnosis: {diagnosis['text']}")
    print(f"\nRun directory: {out_dir}", file=sys.stderr)
    return summary
