"""The ``twinserve`` command line: one subcommand per job, each a thin layer over a library call.

Each ``experiments/cli/cmd_*.py`` module registers its subcommands through
``register(subparsers)`` and imports its heavy dependencies (torch, pandas, simpy) only when its
command runs, so ``twinserve --help`` and the simulator start fast. Flags that several commands
share are defined once, in ``experiments.cli.flags``; the tail every run ends in (run directory,
printed summary) is ``experiments.cli.reporting``. ``python -m experiments.cli`` is
``twinserve``.

One exit policy for every command (``main``; streams and signals: ``experiments.cli.console``):

* bad input (a malformed file, an invalid knob, a path that cannot be used) ends with one
  ``twinserve: error: …`` line on stderr and exit status 2, never a traceback; so does an
  environment that refuses a write (a full disk, a read-only file system, no permission);
* SIGINT, SIGTERM and SIGHUP stop the command and everything it started, remove what it had
  half-written, and exit with 128 + the signal's number;
* output that could not be printed (a broken pipe, a full device) makes the exit status
  non-zero (141 for a broken pipe), after the command's files are complete;
* anything else is a bug and shows its traceback.

This module imports nothing heavy before ``main`` has installed the signal handlers, so an
early Ctrl-C is an orderly stop, not a traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from engine.gc_freeze import frozen_when_done, unfrozen_when_done
from experiments.cli.console import Interrupted, Session

#: Modules that contribute subcommands, in ``--help`` order.
COMMAND_MODULES: tuple[str, ...] = (
    "experiments.cli.cmd_sim",
    "experiments.cli.cmd_reports",
    "experiments.cli.cmd_real",
    "experiments.cli.cmd_run_real",
    "experiments.cli.cmd_serve",
    "experiments.cli.cmd_topology",
    "experiments.cli.cmd_bench",
    "experiments.cli.cmd_validate",
    "experiments.cli.cmd_sweep",
    "experiments.cli.cmd_plan",
    "experiments.cli.cmd_core",
    "experiments.cli.cmd_compile",
)

#: OSError numbers that describe the machine, not a bug: reported in one line.
ENVIRONMENT_ERRNOS = frozenset({
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
    errno.EMFILE, errno.ENFILE, errno.EIO, errno.ELOOP, errno.ENOTDIR, errno.EISDIR,
})


class _Parser(argparse.ArgumentParser):
    """argparse with the house error format: one ``twinserve: error:`` line (naming the
    command and pointing at its ``--help``) instead of a usage block and a second line."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        self.exit(2, f"twinserve: error: {where}{message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, only as much of it as that command needs:
    the modules are registered in order until one adds ``command`` (all of them when none
    does, so an unknown command is refused with the full list). ``twinserve simulate`` thus
    imports no other command's module (≈ 10 ms of a 10,000-request run's start)."""
    parser = _Parser(
        prog="twinserve",
        description="LLM serving engine modelled on vLLM V1: one scheduler core, simulated "
        "or real.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # a command module not present in this checkout
            raise
        module.register(sub)
        if command is not None and command in sub.choices:
            break
    return parser


#: Commands that do no sizable linear algebra (the real engine's commands run torch, which may
#: use OpenBLAS on some platforms, and are left alone).
_BLAS_LIGHT_COMMANDS = frozenset(
    {"simulate", "sweep", "plan", "report", "compare", "replay-schedule", "compile"}
)


def _one_blas_thread(argv: Sequence[str]) -> None:
    """numpy's OpenBLAS starts a thread per core at import, and they spin for a while: ≈ 0.1 s
    of CPU taken from the core a simulation's report process imports pandas on. These commands
    need one BLAS thread at most (a value the user exported is kept). Effective only before
    numpy is imported, which ``build_parser`` does."""
    if argv[:1] and argv[0] in _BLAS_LIGHT_COMMANDS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _importable_cwd() -> None:
    """Modules in the current directory can be imported, as with ``python -m``: a user's
    ``--scheduling-policy mymodule:MyPolicy`` next to where they run ``twinserve``. Appended,
    so it never shadows an installed module; processes the commands start inherit it."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (see the module docstring for the policy)."""
    session = Session.start()
    try:
        status = _run(argv)
    except Interrupted as exc:
        status = _interrupted(exc)
    except KeyboardInterrupt:  # raised by code that caught ours and raised its own
        status = _interrupted(Interrupted(2))
    except SystemExit as exc:  # argparse: --help, usage errors
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    else:
        if session.interrupted is not None:  # swallowed where it was raised (see console)
            status = _interrupted(session.interrupted)
    status = session.finish(status)
    if argv is not None:  # called in-process (tests): leave the caller's streams alone
        session.restore()
    elif session.interrupted is not None:
        # everything the command started has been stopped and its half-written output
        # removed (the finally blocks ran); exit now rather than let the interpreter join
        # threads still waiting on work that was cancelled (plan's probe threads)
        os._exit(status)
    else:
        _exit_without_teardown(status)
    return status


def _exit_without_teardown(status: int) -> None:
    """End a finished command now, skipping the interpreter's teardown: freeing every
    module's objects (numpy, pandas, pyarrow …) one by one costs ≈ 0.1 s of CPU after a
    simulation, 5% of a 10,000-request run. What the teardown does that matters is done
    first: the atexit handlers run (multiprocessing's clean-up, temporary directories,
    Ray), and both streams are flushed. Only when no other thread runs — the interpreter
    would wait for a non-daemon one — otherwise it returns and the normal exit follows."""
    import atexit
    import contextlib
    import threading

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None or threading.active_count() > 1:
        return
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:  # lost output was counted in the status (Session.finish)
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(status)


def _interrupted(exc: Interrupted) -> int:
    name = "" if exc.signum == 2 else f" ({exc})"
    print(f"twinserve: interrupted{name}", file=sys.stderr)
    return exc.exit_status


def _run(argv: Sequence[str] | None) -> int:
    words = sys.argv[1:] if argv is None else argv
    _one_blas_thread(words)
    _importable_cwd()
    with unfrozen_when_done():
        with frozen_when_done():  # start-up: see engine/gc_freeze.py
            parser = build_parser(words[0] if words and not words[0].startswith("-") else None)
            args = parser.parse_args(argv)
        return _call(args)


def _call(args: argparse.Namespace) -> int:
    """Run the parsed command; bad input and the machine's refusals become one line."""
    from engine.core.errors import UserError

    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UserError as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("twinserve: error: out of memory: the run needs more memory than this machine "
              "gives it; make it smaller", file=sys.stderr)
        return 1
    except Exception as exc:
        message = _environment_error(exc)
        if message is None:
            raise
        print(f"twinserve: error: {message}", file=sys.stderr)
        return 2


def _environment_error(exc: Exception) -> str | None:
    """One line for an exception the machine caused (a full disk, no permission …), or
    None for a bug."""
    from engine.output_dir import is_disk_full
    from engine.paths import describe_os_error

    if is_disk_full(exc):
        where = getattr(exc, "filename", None)
        return ("no space left on the device" + (f" (writing {where})" if where else "")
                + ": nothing half-written was kept; free some space and run it again")
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
        return describe_os_error(exc, exc.filename or "?", "file")
    return None
