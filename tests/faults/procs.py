"""Run ``twinserve`` as a user's shell would, and hurt it: signals at chosen moments, closed
or broken standard streams, and a check that nothing it started outlives it.

Every command runs in its own session with a unique environment tag; ``survivors`` lists the
processes that still carry the tag after the command has exited (the orphan check: pool
workers, the report process, anything forked). The tests kill the survivors they find.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TAG_VAR = "TWINSERVE_FAULT_TAG"
#: Seconds a command's children get to go after the command itself has exited.
ORPHAN_GRACE_S = 3.0


@dataclass
class Finished:
    """A command that ran: its exit status, output and what outlived it."""

    rc: int
    stdout: str
    stderr: str
    survivors: list[int] = field(default_factory=list)
    signalled: bool = False  # the signal was sent before the command exited
    exit_after_signal_s: float | None = None

    @property
    def error_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("twinserve: error:")]


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag``."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def survivors_of(tag: str, grace_s: float = ORPHAN_GRACE_S) -> list[int]:
    """What still runs with ``tag`` after ``grace_s``; those found are killed."""
    deadline = time.monotonic() + grace_s
    while True:
        pids = tagged_pids(tag)
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids


def command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "experiments.cli", *args]


def environment(tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env[TAG_VAR] = tag
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.pop("COLUMNS", None)
    return env


def run_cli(
    args: Sequence[str],
    cwd: Path,
    *,
    sig: int | None = None,
    after_s: float | None = None,
    when_exists: Sequence[Path] = (),
    to_group: bool = False,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
    shell_suffix: str | None = None,
    timeout_s: float = 90.0,
) -> Finished:
    """Run ``twinserve ARGS`` in ``cwd``; with ``sig``, send it ``after_s`` seconds in (or
    as soon as one of ``when_exists`` appears) to the process (or its whole group)."""
    tag = uuid.uuid4().hex
    argv: list[str] | str = command(args)
    if shell_suffix is not None:  # e.g. "2>&-": through sh, as a user types it
        argv = "exec " + " ".join(map(_quote, argv)) + " " + shell_suffix
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=environment(tag), stdout=stdout, stderr=stderr,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            shell=shell_suffix is not None)
    signalled = False
    sent_at = 0.0
    if sig is not None:
        while proc.poll() is None:
            waited = time.monotonic() - start
            if (after_s is not None and waited >= after_s) or any(
                    p.exists() or list(p.parent.glob(p.name)) for p in when_exists):
                (os.killpg if to_group else os.kill)(proc.pid, sig)
                signalled, sent_at = True, time.monotonic()
                break
            if waited > timeout_s:
                break
            time.sleep(0.01)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{args[0]} did not finish in {timeout_s} s: {err[-2000:]}") from None
    exit_after = time.monotonic() - sent_at if signalled else None
    return Finished(proc.returncode, out or "", err or "", survivors_of(tag), signalled,
                    exit_after)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
