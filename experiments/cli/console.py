"""The command's standard streams and signals: one policy for every ``twinserve`` command.

``Session.start()`` runs first in ``main``, before any heavy import, and sets up:

* **closed streams**: a standard stream the caller closed (``2>&-``) is opened on ``/dev/null``
  (so no file the command opens can become fd 1 or 2, and ``sys.stderr`` is never None) and
  whatever is written to it is dropped: closing a stream is a choice, like ``2>/dev/null``;
* **guarded streams**: ``sys.stdout`` and ``sys.stderr`` become ``GuardedStream`` wrappers that
  never raise. A write that fails (a broken pipe, a full ``/dev/full``) is recorded and the
  stream goes quiet, so a lost progress line never costs a finished result; at the end,
  ``finish`` turns a lost stream into a non-zero exit status (141 for a broken pipe, 1
  otherwise) with one ``twinserve: error:`` line if stderr still works — a lost line is never
  reported as success;
* **signals**: SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` (a ``KeyboardInterrupt``) in
  the main thread, so every command's ``finally`` blocks and context managers run: pools and
  child processes are stopped, partial output directories removed. The exit status is
  128 + the signal's number. A second signal during that cleanup exits at once.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

#: Signals that stop a command in order (SIGKILL cannot be caught; children watch for it).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Exit status of a command whose output pipe was closed by its reader (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised in the main thread (``signum``: which one)."""

    def __init__(self, signum: int) -> None:
        # args must rebuild the exception: simpy re-raises ``type(exc)(*exc.args)``
        super().__init__(signum)
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class GuardedStream:
    """A text stream that never raises: failed writes are recorded, then dropped.

    ``dropped`` streams (closed by the caller) accept everything silently."""

    def __init__(self, name: str, stream: TextIO, dropped: bool = False) -> None:
        self.name = name
        self._stream = stream
        self.dropped = dropped
        self.error: OSError | None = None  # the first failure; the stream is quiet after it

    @property
    def lost(self) -> bool:
        return self.error is not None

    def write(self, text: str) -> int:
        if self.dropped or self.error is not None:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._fail(exc)
            return len(text)

    def flush(self) -> None:
        if self.dropped or self.error is not None:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.error = exc
        # nothing more reaches the broken file: the interpreter's last flush at exit must not
        # fail again (it would print "Exception ignored" and change the exit status)
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        try:
            return not self.dropped and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, buffer …
        return getattr(self._stream, name)


def _fd_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def _reopen(fd: int) -> TextIO:
    """Open ``/dev/null`` as ``fd`` (a closed standard stream) and a text stream on it."""
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    return open(fd, "w" if fd else "r", closefd=False, encoding="utf-8",
                errors="backslashreplace")


@dataclass(slots=True)
class Session:
    """The standard streams and signal handlers of one command (see the module docstring)."""

    stdout: GuardedStream
    stderr: GuardedStream
    interrupted: Interrupted | None = None
    finished: bool = False  # the command has returned: a signal now exits at once
    previous: dict[int, Any] = field(default_factory=dict)  # signal -> the handler before
    streams: tuple[Any, Any] = (None, None)  # sys.stdout, sys.stderr before
    unraisable: Any = None  # sys.unraisablehook before
    pid: int = field(default_factory=os.getpid)  # the command's process (not a forked child)

    @classmethod
    def start(cls) -> Session:
        closed = {fd: _fd_closed(fd) for fd in (0, 1, 2)}
        if closed[0]:
            sys.stdin = _reopen(0)
        streams = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            current = getattr(sys, name)
            if isinstance(current, GuardedStream):
                current = current._stream
            if closed[fd] or current is None:
                current = _reopen(fd)
            streams.append(GuardedStream(name, current, dropped=closed[fd]))
        session = cls(streams[0], streams[1], streams=(sys.stdout, sys.stderr))
        sys.stdout, sys.stderr = session.stdout, session.stderr  # type: ignore[assignment]
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                session.previous[sig] = signal.signal(sig, session._on_signal)
            session.unraisable = sys.unraisablehook
            sys.unraisablehook = session._on_unraisable
        return session

    def _on_unraisable(self, info: Any) -> None:
        """A signal's ``Interrupted`` raised where Python cannot propagate it (a weakref or
        import-lock callback, a ``__del__``): it is not lost, ``main`` reads
        ``interrupted`` when the command returns; say nothing here."""
        if isinstance(info.exc_value, Interrupted):
            return
        (self.unraisable or sys.__unraisablehook__)(info)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a forked child before it set its own handlers
            if signum != signal.SIGINT:  # SIGINT is the command's to handle; else die quietly
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if self.finished:  # the command is done: only the interpreter's exit is left
            os._exit(128 + signum)
        if self.interrupted is not None:  # a second signal while stopping: stop now
            self.stderr.write(f"twinserve: {signal.Signals(signum).name} again: exiting at "
                              "once\n")
            self.stderr.flush()
            os._exit(128 + signum)
        self.interrupted = Interrupted(signum)
        raise self.interrupted

    def finish(self, status: int) -> int:
        """Flush both streams; the exit status, made non-zero if output was lost."""
        self.finished = True
        self.stdout.flush()
        self.stderr.flush()
        lost = [s for s in (self.stdout, self.stderr) if s.lost]
        if not lost or status not in (0,):
            return status
        broken = any(s.error is not None and s.error.errno == errno.EPIPE for s in lost)
        names = " and ".join(s.name for s in lost)
        reason = "; ".join(f"{s.name}: {s.error.strerror or s.error}" for s in lost
                           if s.error is not None)
        self.stderr.write(f"twinserve: error: output to {names} was lost ({reason}); "
                          "the command's files are complete, its printed output is not\n")
        self.stderr.flush()
        return EXIT_BROKEN_PIPE if broken else 1

    def restore(self) -> None:
        """Put back the signal handlers and streams (for callers that run ``main``
        in-process, such as tests)."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()
        if self.unraisable is not None and sys.unraisablehook == self._on_unraisable:
            sys.unraisablehook = self.unraisable
        if sys.stdout is self.stdout and self.streams[0] is not None:
            sys.stdout = self.streams[0]
        if sys.stderr is self.stderr and self.streams[1] is not None:
            sys.stderr = self.streams[1]
