"""Write a run directory from a second process that prepares while the run itself goes on.

The report stack (pyarrow and ``reports``; not pandas, which only plots and CSV files need:
``reports.columns``) takes about as long to import as the whole simulation of a small run.
``ReportProcess.start()``, called before a run, forks a process that imports it meanwhile on
another core (``_no_collections_while_importing``) and then waits; after the run, ``write``
sends it the event log (``EventLog.export()``, a column at a time: typed arrays as their raw
bytes, not pickled — placed in a memory file both processes hold and mapped there, where the
system has one; ``send_export``) and the run's *staging* directory, and it builds the tables
and writes the run's files there exactly as ``reports.run_dir.write_run_files`` does in-process
(it is that function), returning what it wrote and the printed summary. A log of more than
``MAX_STEPS_COPIED`` steps is handed over rather than copied (the run keeps none of it), and
the process frees each part of it once its tables are built: a million-request run never holds
its log and its tables together (its columns go down the connection, not through the memory
file, which would hold them all). The run itself commits the directory: a report process never
publishes one, and it dies with the run (``engine.process_guard.die_with_parent``), so an
orphan can neither finish nor publish.

It is an optimisation only, so it steps aside whenever it would not help or might not work:
``start`` returns None where ``fork`` is unavailable, when the report stack is already imported
(a test session, a sweep), or with ``TWINSERVE_REPORT_PROCESS=0``; ``write`` returns None —
the caller then writes in-process — if the process died or failed for any reason other than a
report error (which it raises as the in-process path would: ``ReportError``), unless the log
had been handed over: then there is no log left to write, and the failure is raised.

Starting it imports nothing of the report stack here: the process imports it, so a run that
forks it early keeps its own start light.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import signal
import sys
import traceback
from array import array
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.events import EventLog
from engine.core.libc import libc
from engine.gc_freeze import frozen_when_done
from reports.errors import ReportError

if TYPE_CHECKING:
    from reports.meta import RunMeta
    from reports.options import SummaryOptions
    from reports.written import WrittenRun

#: Logs with more steps than this are handed over instead of copied: moved out of the run's
#: log (``EventLog.take_export``) and sent column by column, each freed once sent, so the run
#: and the report process never hold the log twice; the report process then frees each part
#: of it once its tables are built (``ExportedLog(owned=True)``). Smaller logs are copied, so
#: that the run still has its log to write in-process should the process fail.
MAX_STEPS_COPIED = 500_000


class ReportProcess:
    """A forked process holding the report stack, waiting for one run's event log."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection,
                 shared_fd: int | None = None) -> None:
        self._process = process
        self._conn = conn
        self._shared_fd = shared_fd  # the memory file both ends hold (``_shared_file``)
        self._sent = False  # did it get a log to write?

    @classmethod
    def start(cls) -> ReportProcess | None:
        """Fork the report process, or None where it would not help (see the module)."""
        if os.environ.get("TWINSERVE_REPORT_PROCESS", "1") == "0" or any(
                name in sys.modules for name in ("pyarrow.parquet", "pandas")):
            return None
        if "fork" not in multiprocessing.get_all_start_methods():
            return None
        ctx = multiprocessing.get_context("fork")
        ours, theirs = ctx.Pipe()
        shared_fd = _shared_file()
        try:
            process = ctx.Process(target=_serve, args=(theirs, ours, os.getpid(), shared_fd),
                                  daemon=True)
            process.start()
        except OSError:
            if shared_fd is not None:
                os.close(shared_fd)
            return None
        theirs.close()
        return cls(process, ours, shared_fd)

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
        instead (a log handed over cannot be: see the module). A report error is raised as
        ``ReportError``."""
        handed_over = False
        try:
            status, value = self._conn.recv()  # ready: the report stack imported
            if status != "ready":
                return None
            handed_over = log.num_steps > MAX_STEPS_COPIED
            exported = log.take_export() if handed_over else log.export()
            self._conn.send((meta, str(out_dir), options, plots, file_format, handed_over))
            self._sent = True
            # a handed-over log's pages go back to the system column by column as they are
            # sent (malloc would keep them), so the run and this process never hold it twice
            send_export(self._conn, exported,
                        on_sent=_return_free_memory if handed_over else None,
                        shared_fd=None if handed_over else self._shared_fd)
            del exported
            status, value = self._conn.recv()
        except (EOFError, OSError):
            if handed_over:
                raise ReportError(
                    "the report process stopped before writing the run directory (out of "
                    "memory?), and the run's event log had been handed to it; rerun with "
                    "TWINSERVE_REPORT_PROCESS=0 to write it in this process"
                ) from None
            return None
        except BaseException:  # interrupted while it writes: stop it now, not after the write
            self._sent = False
            raise
        finally:
            self.close()
        if status == "report-error":
            raise ReportError(value)
        if status != "ok":
            if handed_over:  # no log left to write in-process: show its failure here
                raise RuntimeError(f"the report process failed (the run's event log had "
                                   f"been handed to it):\n{value}")
            return None  # it failed: the in-process path shows the same failure, in full
        written, text = value
        return written, text

    def close(self) -> None:
        """Stop the process: it exits when the connection closes after its reply; one that
        got nothing to write (the run failed or was interrupted) is terminated at once."""
        try:
            self._conn.close()
            if self._shared_fd is not None:
                os.close(self._shared_fd)
                self._shared_fd = None
        finally:
            if not self._sent:
                self._process.terminate()
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()


def _serve(conn: Connection, parent_end: Connection | None = None,
           parent_pid: int | None = None, shared_fd: int | None = None) -> None:
    """The report process: import the report stack, say it is ready, then write one run
    directory.
    ``parent_end``, the other end of the pipe (inherited by the fork), is closed first, so
    that the run closing its end is seen here as the end of the conversation.
    ``shared_fd``: the memory file the run may place typed columns in (``_shared_file``)."""
    if parent_end is not None:
        parent_end.close()
    if parent_pid is not None:  # a forked process (tests run this function in a thread)
        _follow_parent(parent_pid)
        _use_system_allocator_for_arrow()
    try:
        with _no_collections_while_importing(forked=parent_pid is not None):
            # pyarrow.parquet and reports.render, which the writers import lazily, are
            # imported now too, while the run goes on
            import pyarrow.parquet  # noqa: F401

            import reports.render  # noqa: F401
            from reports.errors import ReportError
            from reports.metrics import format_summary
            from reports.run_dir import write_run_files
            from reports.tables import ExportedLog, build_columns
    except BaseException:
        _reply(conn, "crash", traceback.format_exc())
        return
    _reply(conn, "ready", None)
    try:
        meta, out_dir, options, plots, file_format, handed_over = conn.recv()
        if handed_over and parent_pid is not None:
            _map_large_blocks()
        exported = recv_export(conn, shared_fd)
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the run ended without a report (an error, an interruption)
    finally:
        if shared_fd is not None:
            os.close(shared_fd)  # the columns' mappings keep what they map
    try:
        tables = build_columns(ExportedLog(exported, owned=True))  # frees the log as it goes
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


@contextlib.contextmanager
def _no_collections_while_importing(forked: bool) -> Iterator[None]:
    """In the forked report process (``forked``), import the report stack with the cyclic
    garbage collector off, then freeze what the process holds — the modules' objects and
    those inherited from the command that forked it, alive as long as the process — and
    turn the collector back on. Importing the report stack creates many objects, which
    the collector, counting allocations, would walk many times over (writing to inherited
    pages too); frozen, its later collections skip them. On Vidur's stream (when the stack
    still held pandas) the import phase took 0.175–0.182 s of CPU instead of 0.210–0.220 s
    (6 alternated pairs). A collector the process had turned off stays off; elsewhere (a
    thread in tests) it is not this function's to change."""
    if not forked:
        yield
        return
    with frozen_when_done():
        yield


def _use_system_allocator_for_arrow() -> None:
    """pyarrow's default memory pool (mimalloc) takes fresh memory in 2 MiB huge pages that
    the kernel clears whole; a run directory's tables are converted and written once, and
    glibc's malloc serves them with fewer pages to clear (on Vidur's stream ≈ 0.05 s less
    system CPU, 5 alternated pairs; the files are the same). Set before pyarrow is imported
    (it reads the variable once); a value the user exported is kept."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


#: glibc's ``mallopt`` parameter: blocks of at least this many bytes get their own mapping.
_M_MMAP_THRESHOLD = -3


def _libc() -> Any:
    """glibc with malloc's tuning calls, or None (another C library, another system: the
    tuning below is skipped). ``engine.core.libc`` loads it once per process (a handover
    trims after every column)."""
    c = libc()
    return c if hasattr(c, "mallopt") and hasattr(c, "malloc_trim") else None


def _map_large_blocks() -> None:
    """In a report process given a handed-over log, give every block of 1 MiB or more its own
    mapping, returned to the system when freed. glibc's default raises that threshold up to
    32 MiB as blocks are freed, after which the per-request columns (8 MB at a million
    requests) come from the heap, and the log parts freed while the tables are built stay in
    the process's memory instead of being reused or returned (≈ 0.1 GB more at the peak of a
    million-request run). A smaller log keeps glibc's default: mapping every large block
    afresh costs a 10,000-request run's report ≈ 21,000 more page faults and ≈ 0.05 s more
    CPU (0.02–0.09 s over four paired runs), to save memory such a run does not need."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)


def _return_free_memory() -> None:
    """Give the memory malloc holds free back to the system (``malloc_trim``): called after
    each column of a handed-over log is sent, so the run keeps only what it still uses."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _follow_parent(parent_pid: int) -> None:
    """Die with the run (``prctl(PR_SET_PDEATHSIG)`` on Linux) and leave its signals to it: a
    Ctrl-C to the terminal's process group stops the run, which stops this process."""
    from engine.process_guard import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(parent_pid=parent_pid)


def send_export(conn: Connection, exported: dict[str, Any],
                on_sent: Callable[[], None] | None = None,
                shared_fd: int | None = None) -> None:
    """Send an ``EventLog.export()`` column by column, emptying ``exported`` as it goes (a
    column sent is freed unless the sender holds it elsewhere): typed arrays as raw bytes,
    with no pickled copy — placed in the memory file ``shared_fd`` when given (the receiver
    maps them: ``recv_export``), else written down the connection; lists and other values
    pickled one at a time. ``on_sent`` is called after each column has been sent and let go."""
    layout = [(key, list(value) if isinstance(value, dict) else None)
              for key, value in exported.items()]
    conn.send(layout)
    placed = _Placement(shared_fd)
    for key, names in layout:
        if names is None:
            _send_column(conn, exported.pop(key), placed)
            if on_sent is not None:
                on_sent()
            continue
        part = exported.pop(key)
        for name in names:
            _send_column(conn, part.pop(name), placed)
            if on_sent is not None:
                on_sent()
        del part


def recv_export(conn: Connection, shared_fd: int | None = None) -> dict[str, Any]:
    """What ``send_export`` sent, as the export it was: typed arrays as typed arrays, or, for
    those placed in the memory file ``shared_fd``, as read-only numpy arrays mapping it."""
    exported: dict[str, Any] = {}
    for key, names in conn.recv():
        if names is None:
            exported[key] = _recv_column(conn, shared_fd)
        else:
            exported[key] = {name: _recv_column(conn, shared_fd) for name in names}
    return exported


def _shared_file() -> int | None:
    """A memory file (Linux's ``memfd_create``) for the run to place its typed columns in,
    created before the fork so that both processes hold it; None where there is none (the
    columns then go down the connection). The report process maps them instead of reading
    a copy into fresh pages: on Vidur's stream (≈ 25 MB of columns) its receipt took 0.006 s
    of CPU and 1,800 page faults instead of 0.02–0.03 s and 7,500, and the whole command
    1.5% less CPU (8 alternated pairs)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        return int(create("twinserve-event-log", os.MFD_CLOEXEC))
    except OSError:
        return None


class _Placement:
    """Where the next column goes in the memory file: each at a page boundary (a mapping's
    offset must be one), one after the other."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.end = 0

    def place(self, data: memoryview) -> int:
        """Write ``data`` at the next page boundary; returns its offset."""
        assert self.fd is not None
        offset = -(-self.end // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY
        at = offset
        while data:
            written = os.pwrite(self.fd, data, at)
            data, at = data[written:], at + written
        self.end = at
        return offset


def _send_column(conn: Connection, column: object, placed: _Placement) -> None:
    if isinstance(column, array):
        raw = memoryview(column).cast("B")
        if placed.fd is not None and len(raw):
            offset = placed.place(raw)
            conn.send(("mapped", column.typecode, len(column), offset))
            return
        conn.send(("array", column.typecode, len(column)))
        _write_all(conn.fileno(), raw)
    else:
        conn.send(("value", column))


def _recv_column(conn: Connection, shared_fd: int | None) -> object:
    message = conn.recv()
    if message[0] == "value":
        return message[1]
    if message[0] == "mapped":
        if shared_fd is None:
            raise ValueError("a column was placed in a memory file this end does not hold")
        _, typecode, length, offset = message
        return _mapped_column(shared_fd, typecode, length, offset)
    _, typecode, length = message
    column = array(typecode, [0]) * length
    _read_into(conn.fileno(), memoryview(column).cast("B"))
    return column


#: Shared (nothing is written through it) and populated at once: the pages are in the file
#: already, so one call maps them all instead of a page fault for each page read.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def _mapped_column(fd: int, typecode: str, length: int, offset: int) -> Any:
    """The column at ``offset`` of the memory file, as a read-only numpy array of the array
    type ``typecode`` over a shared, read-only mapping of it (``_MAP_FLAGS``): no copy is
    made; the pages are the file's own until the process lets go of the array."""
    import numpy as np

    dtype = np.dtype(typecode)
    mapping = mmap.mmap(fd, length * dtype.itemsize, flags=_MAP_FLAGS, prot=mmap.PROT_READ,
                        offset=offset)
    return np.frombuffer(mapping, dtype=dtype, count=length)


def _write_all(fd: int, data: memoryview) -> None:
    """Write ``data`` whole to ``fd``, the connection's own descriptor, after the header that
    announced its length: raw, beside the connection's framed messages (which read exactly
    what each frame holds, so nothing is read ahead). The kernel copies it straight from
    the column; no bytes object is made."""
    while data:
        data = data[os.write(fd, data):]


def _read_into(fd: int, buffer: memoryview) -> None:
    """Fill ``buffer`` from ``fd`` (``_write_all``'s other end): the kernel copies the bytes
    straight into the column, where ``Connection.recv_bytes`` would gather them in a growing
    buffer, copy that into a bytes object and then into the column."""
    while buffer:
        n = os.readv(fd, [buffer])
        if n == 0:
            raise EOFError("the connection closed in the middle of a column")
        buffer = buffer[n:]


def _reply(conn: Connection, status: str, value: object) -> None:
    with contextlib.suppress(OSError, ValueError):  # the run may be gone
        conn.send((status, value))
