"""Write a run directory from a second process that prepares while the run itself goes on.

The report stack (pandas, pyarrow, ``reports``) takes ≈ 0.4 s to import, about as long as the
whole simulation of a small run. ``ReportProcess.start()``, called before a run, forks a process
that imports it meanwhile on another core and then waits; after the run, ``write`` sends it the
event log (``EventLog.export()``: plain arrays, whose bytes go through the pipe as they are,
not pickled: ``send_export``) and the run's *staging* directory, and it builds
the tables and writes the run's files there exactly as ``reports.run_dir.write_run_files`` does
in-process (it is that function), returning what it wrote and the printed summary. The run
itself commits the directory: a report process never publishes one, and it dies with the run
(``engine.process_guard.die_with_parent``), so an orphan can neither finish nor publish.

It is an optimisation only, so it steps aside whenever it would not help or might not work:
``start`` returns None where ``fork`` is unavailable, when the report stack is already imported
(a test session, a sweep), or with ``TWINSERVE_REPORT_PROCESS=0``; ``write`` returns None —
the caller then writes in-process — for logs too large to copy cheaply, or if the process
died or failed for any reason other than a report error (which it raises as the in-process
path would: ``ReportError``).

Starting it imports nothing of the report stack here: the process imports it, so a run that
forks it early keeps its own start light.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import traceback
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.events import EventLog
from reports.errors import ReportError

if TYPE_CHECKING:
    from reports.meta import RunMeta
    from reports.options import SummaryOptions
    from reports.written import WrittenRun

#: Logs with more steps than this are written in-process (copying one to the report process
#: would briefly double the memory a long run holds).
MAX_STEPS_SENT = 500_000


class ReportProcess:
    """A forked process holding the report stack, waiting for one run's event log."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self._process = process
        self._conn = conn
        self._sent = False  # did it get a log to write?

    @classmethod
    def start(cls) -> ReportProcess | None:
        """Fork the report process, or None where it would not help (see the module)."""
        if os.environ.get("TWINSERVE_REPORT_PROCESS", "1") == "0" or "pandas" in sys.modules:
            return None
        if "fork" not in multiprocessing.get_all_start_methods():
            return None
        ctx = multiprocessing.get_context("fork")
        ours, theirs = ctx.Pipe()
        try:
            process = ctx.Process(target=_serve, args=(theirs, ours, os.getpid()),
                                  daemon=True)
            process.start()
        except OSError:
            return None
        theirs.close()
        return cls(process, ours)

    def write(
        self,
        log: EventLog,
        meta: RunMeta | Mapping[str, Any],
        out_dir: Path,
        options: SummaryOptions,
        plots: bool,
        file_format: str,
    ) -> tuple[WrittenRun, str] | None:
        """Have the process write the run's files into ``out_dir`` (a staging directory the
        caller commits: the process itself never publishes a run directory); returns what it
        wrote and the printed summary, or None if the caller should write it in-process
        instead. A report error is raised as ``ReportError``."""
        try:
            if log.num_steps > MAX_STEPS_SENT:
                return None
            send_export(self._conn, log.export(), (meta, str(out_dir), options, plots,
                                                   file_format))
            self._sent = True
            status, value = self._conn.recv()
        except (EOFError, OSError):
            return None
        except BaseException:  # interrupted while it writes: stop it now, not after the write
            self._sent = False
            raise
        finally:
            self.close()
        if status == "report-error":
            raise ReportError(value)
        if status != "ok":
            return None  # it failed: the in-process path shows the same failure, in full
        written, text = value
        return written, text

    def close(self) -> None:
        """Stop the process: it exits when the connection closes after its reply; one that
        got nothing to write (the run failed or was interrupted) is terminated at once."""
        try:
            self._conn.close()
        finally:
            if not self._sent:
                self._process.terminate()
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()


def _serve(conn: Connection, parent_end: Connection | None = None,
           parent_pid: int | None = None) -> None:
    """The report process: import the report stack, then write one run directory.
    ``parent_end``, the other end of the pipe (inherited by the fork), is closed first, so
    that the run closing its end is seen here as the end of the conversation."""
    if parent_end is not None:
        parent_end.close()
    if parent_pid is not None:  # a forked process (tests run this function in a thread)
        _follow_parent(parent_pid)
    try:
        # pyarrow.parquet and reports.render, which the writers import lazily, are imported
        # now too, while the run goes on
        import pyarrow.parquet  # noqa: F401

        import reports.render  # noqa: F401
        from reports.errors import ReportError
        from reports.metrics import format_summary
        from reports.run_dir import write_run_files
        from reports.tables import ExportedLog, build_tables
    except BaseException:
        _reply(conn, "crash", traceback.format_exc())
        return
    try:
        exported, request = recv_export(conn)
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the run ended without a report (an error, an interruption)
    try:
        meta, out_dir, options, plots, file_format = request
        tables = build_tables(ExportedLog(exported))
        del exported
        written = write_run_files(
            Path(out_dir), tables, meta, goodput=options.goodput,
            percentiles=options.percentiles, percentile_metrics=options.percentile_metrics,
            plots=plots, file_format=file_format,
        )
        _reply(conn, "ok", (written, format_summary(written.summary)))
    except ReportError as exc:
        _reply(conn, "report-error", str(exc))
    except BaseException:
        _reply(conn, "crash", traceback.format_exc())


@dataclass(frozen=True, slots=True)
class _Buffer:
    """Where a typed array of the exported log was: its bytes follow the message."""

    typecode: str


def send_export(conn: Connection, exported: dict[str, Any], rest: tuple[Any, ...]) -> None:
    """Send ``(exported, rest)``: one pickled message in which every typed array of
    ``exported`` (nested dicts of arrays and lists) is a ``_Buffer``, then the arrays' bytes as
    they are, in the order the message names them. Pickling the arrays would copy them twice
    more (≈ 0.07 s of CPU for a 10,000-request run's 27 MB)."""
    buffers: list[array[Any]] = []

    def strip(value: Any) -> Any:
        if isinstance(value, array):
            buffers.append(value)
            return _Buffer(value.typecode)
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items()}
        return value

    conn.send((strip(exported), rest))
    for buffer in buffers:
        conn.send_bytes(memoryview(buffer).cast("B"))


def recv_export(conn: Connection) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """What ``send_export`` sent: the exported log with its arrays back, and the rest."""
    skeleton, rest = conn.recv()

    def fill(value: Any) -> Any:
        if isinstance(value, _Buffer):
            restored = array(value.typecode)
            restored.frombytes(conn.recv_bytes())
            return restored
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    return fill(skeleton), rest


def _follow_parent(parent_pid: int) -> None:
    """Die with the run (``prctl(PR_SET_PDEATHSIG)`` on Linux) and leave its signals to it: a
    Ctrl-C to the terminal's process group stops the run, which stops this process."""
    from engine.process_guard import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(parent_pid=parent_pid)


def _reply(conn: Connection, status: str, value: object) -> None:
    with contextlib.suppress(OSError, ValueError):  # the run may be gone
        conn.send((status, value))
