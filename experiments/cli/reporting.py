"""The common tail of every run (simulated or real): write the run directory and print results.

``simulate`` and ``run-real`` both end in ``write_run``: through the forked report process when
the command started one before its run (``start_report_process``; ``simulate`` does, so the
report stack imports while it simulates), else in-process; either way the same files and the
same printed summary. The vllm-bench-style result flags (``--goodput KEY:MS …``,
``--metric-percentiles``, ``--percentile-metrics``) are parsed by ``report_options`` before the
run, so a bad one costs nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError

if TYPE_CHECKING:
    from engine.core.events import EventLog
    from reports.meta import RunMeta
    from reports.options import SummaryOptions
    from reports.report_process import ReportProcess


def report_options(args: argparse.Namespace) -> SummaryOptions:
    """The summary options of ``--goodput``, ``--metric-percentiles`` and
    ``--percentile-metrics`` (parsed by ``reports.options``, as ``report`` parses them).
    Call it before a run starts: a bad flag then costs nothing."""
    from reports.errors import ReportError
    from reports.options import SummaryOptions

    try:
        return SummaryOptions.parse(args.goodput, args.metric_percentiles,
                                    args.percentile_metrics)
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


def start_report_process() -> ReportProcess | None:
    """Fork the report process before a run, or None where it would not help (see
    ``reports.report_process``)."""
    from reports.report_process import ReportProcess

    return ReportProcess.start()


@dataclass(slots=True)
class FinishedRun:
    """A run handed over to be written: its metadata and event log. ``write_run`` lets go of
    the log (sets it to None) once the tables are built, so a million-request log and its
    tables are never in memory together; the caller should hold no other reference to it."""

    meta: RunMeta
    log: EventLog | None


def write_run(
    run: FinishedRun,
    out_dir: Path,
    args: argparse.Namespace,
    options: SummaryOptions,
    reporter: ReportProcess | None = None,
) -> dict[str, Any]:
    """Write the run directory (tables, summary, report) and print the summary; the summary.

    With a ``reporter`` the forked process writes it, unless it steps aside (then, as without
    one, it is written here). ``args`` gives ``--no-plots`` and ``--format``; a report error
    is a ``UserError``.
    """
    from reports.errors import ReportError

    assert run.log is not None, "a FinishedRun is written once"
    plots, file_format = not args.no_plots, args.format
    try:
        if reporter is not None:
            written = reporter.write(run.log, run.meta, out_dir, options, plots=plots,
                                     file_format=file_format)
            if written is not None:
                run.log = None
                print_summary(*written, out_dir)
                return written[0]
        from reports.metrics import format_summary
        from reports.run_dir import write_run_dir_from_tables
        from reports.tables import build_tables

        tables = build_tables(run.log)
        run.log = None  # the event log is no longer needed: free it before rendering
        summary = write_run_dir_from_tables(
            out_dir, tables, run.meta, goodput=options.goodput, percentiles=options.percentiles,
            percentile_metrics=options.percentile_metrics, plots=plots, file_format=file_format,
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
