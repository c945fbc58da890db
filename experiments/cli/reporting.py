"""The common tail of every run (simulated or real): write the run directory and print results.

``simulate``, ``run-real`` and ``serve --record-dir`` open their run directory before the run
(``open_out_dir``: the location is checked and locked at once, so a bad or busy ``--out`` costs
nothing) and end in ``write_run``: the files go into the directory's staging area, through the
forked report process when the command started one (``start_report_process``; ``simulate``
does, so the report stack imports while it simulates), else in-process; then the directory is
committed whole. The vllm-bench-style result flags (``--goodput KEY:MS …``,
``--metric-percentiles``, ``--percentile-metrics``) are parsed by ``report_options`` before the
run, so a bad one costs nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError

if TYPE_CHECKING:
    from engine.core.events import EventLog
    from engine.output_dir import OutputDir
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


def open_out_dir(path: Path, kind: str = "run", keep: Sequence[str] = ()) -> OutputDir:
    """Open the output directory before any work starts: an ``--out`` that cannot be one (an
    existing file, a path under a file, an unwritable place, a name too long), one another
    command is writing, or a non-empty directory that is not a ``kind`` output is refused at
    once instead of after a long run (``engine.output_dir.OutputDir``). The caller writes into
    ``.staging`` and commits, or leaves the ``with`` block to discard it."""
    from engine.output_dir import OutputDir

    return OutputDir(path, kind, keep=keep).open()


def start_report_process() -> ReportProcess | None:
    """Fork the report process before a run, or None where it would not help (see
    ``reports.report_process``)."""
    from reports.report_process import ReportProcess

    return ReportProcess.start()


@dataclass(slots=True)
class FinishedRun:
    """A run handed over to be written: its metadata and event log. ``write_run`` takes the
    log: the report process gets it, or its storage is moved out and freed part by part as
    the tables are built here (``reports.tables.take_columns``), so a million-request log and
    its tables are never in memory together. The caller must hold no other reference to it
    (it is left empty)."""

    meta: RunMeta
    log: EventLog | None


def write_run(
    run: FinishedRun,
    out: OutputDir,
    args: argparse.Namespace,
    options: SummaryOptions,
    reporter: ReportProcess | None = None,
    extra: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Write the run directory (tables, summary, report) into ``out`` and commit it, then
    print the summary; the summary.

    With a ``reporter`` the forked process writes the files, unless it steps aside (then, as
    without one, they are written here). ``extra`` adds files of the caller's (serve's own
    tables) before the commit. ``args`` gives ``--no-plots`` and ``--format``; a report error
    is a ``UserError``.
    """
    from reports.written import commit_run

    assert run.log is not None, "a FinishedRun is written once"
    plots, file_format = not args.no_plots, args.format
    written = None
    if reporter is not None:
        result = reporter.write(run.log, run.meta, out.staging, options, plots=plots,
                                file_format=file_format)
        if result is not None:
            run.log = None
            written, text = result
        else:
            _empty(out.staging)  # whatever the process left before it failed
    if written is None:
        from reports.metrics import format_summary
        from reports.run_dir import write_run_files
        from reports.tables import take_columns

        tables = take_columns(run.log)
        run.log = None  # emptied: nothing of it is held while the files are rendered
        written = write_run_files(
            out.staging, tables, run.meta, goodput=options.goodput,
            percentiles=options.percentiles, percentile_metrics=options.percentile_metrics,
            plots=plots, file_format=file_format,
        )
        text = format_summary(written.summary)
    if extra is not None:
        extra(out.staging)
    commit_run(out, written)
    print_summary(written.summary, text, out.requested)
    return written.summary


def _empty(directory: Path) -> None:
    import shutil

    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def print_summary(summary: dict[str, Any], text: str, out_dir: Path) -> None:
    """Print a run's summary (``text``: ``reports.metrics.format_summary(summary)``), its
    diagnosis, and where the run directory is."""
    print(text)
    diagnosis = summary.get("diagnosis")
    if isinstance(diagnosis, dict) and diagnosis.get("text"):
        print(f"\nDiagnosis: {diagnosis['text']}")
    print(f"\nRun directory: {out_dir}", file=sys.stderr)
