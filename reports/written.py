"""A run directory once its files are written: the record its manifest needs, and publishing it.

Pandas-free on purpose: the parent of a simulation publishes what the forked report process
wrote, and importing the report stack there as well would cost it the report stack's import
(about 0.3 s of CPU) a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.output_dir import OutputDir


@dataclass(frozen=True, slots=True)
class WrittenRun:
    """What ``reports.run_dir.write_run_files`` put into a directory, for its manifest."""

    summary: dict[str, Any]  # the summary.json object
    rows: dict[str, int]  # table file -> row count
    data: tuple[str, ...]  # the files a reader needs intact: config.json and the tables
    report_options: dict[str, Any]  # report_options_dict of the summary


def commit_run(out: OutputDir, written: WrittenRun) -> Path:
    """Publish a run directory written into ``out.staging`` (manifest last, then rename)."""
    return out.commit(rows=written.rows, data=written.data,
                      info={"report_options": written.report_options})
