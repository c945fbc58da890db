"""The common tail of every run (simulated or real): write the run directory and print results.

Parses the vllm-bench-style result flags (``--goodput KEY:MS …``, ``--metric-percentiles``,
``--percentile-metrics``) with ``reports.options`` and hands the tables to
``reports.run_dir.write_run_dir_from_tables``.
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

def report_options(args: argparse.Namespace) -> dict[str, Any]:
    """The summary options of ``--goodput``, ``--metric-percentiles`` and
    ``--percentile-metrics`` (parsed by ``reports.options``, as ``report`` parses them).
    Call it before a run starts: a bad flag then costs nothing."""
    from reports.errors import ReportError
    from reports.options import parse_goodput, parse_percentile_metrics, parse_percentiles

    try:
        return {
            "goodput": parse_goodput(args.goodput) if args.goodput else None,
            "percentiles": parse_percentiles(args.metric_percentiles),
            "percentile_metrics": parse_percentile_metrics(args.percentile_metrics),
        }
    except ReportError as exc:
        raise UserError(str(exc)) from None


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
    *,
    tables: RunTables,
    meta: dict[str, Any],
    out_dir: Path,
    args: argparse.Namespace,
    options: dict[str, Any],
) -> dict[str, Any]:
    """Write the run directory (tables, summary, report) and print the summary.

    Takes the tables (``reports.tables.build_tables(log)``) rather than the event log, so a
    caller can let go of a large log before the report is rendered; ``options`` are
    ``report_options(args)``, parsed by the caller before its run.
    """
    from reports.errors import ReportError
    from reports.metrics import format_summary
    from reports.run_dir import write_run_dir_from_tables

    try:
        summary = write_run_dir_from_tables(
            out_dir,
            tables,
            meta,
            **options,
            plots=not args.no_plots,
            file_format=args.format,
        )
    except ReportError as exc:
        raise UserError(str(exc)) from None
    print_summary(summary, format_summary(summary), out_dir)
    return summary


def print_summary(summary: dict[str, Any], text: str, out_dir: Path) -> None:
    """Print a run's summary (``text``: ``reports.metrics.format_summary(summary)``), its
    diagnosis, and where the run directory is."""
    print(text)
    diagnosis = summary.get("diagnosis")
    if isinstance(diagnosis, dict) and diagnosis.get("text"):
        print(f"\nDiagnosis: {diagnosis['text']}")
    print(f"\nRun directory: {out_dir}", file=sys.stderr)
