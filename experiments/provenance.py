"""Provenance stamped into every run directory: version, git commit, date, Python, and how many
modules ran compiled (``twinserve compile``: speed only, never decisions)."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

from engine.compiled import loaded_compiled_modules
from reports.meta import Provenance


@cache
def git_commit() -> str | None:
    """The checkout's commit (with ``-dirty`` when a tracked file has uncommitted changes), if
    any: one ``git status`` gives both (its ``# branch.oid`` header line; any other line is a
    changed file)."""
    root = Path(__file__).resolve().parents[1]
    try:
        status = subprocess.run(
            ["git", "status", "--porcelain=v2", "--branch", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return commit_from_status(status.stdout) if status.returncode == 0 else None


def commit_from_status(porcelain_v2: str) -> str | None:
    """``git_commit`` read from ``git status --porcelain=v2 --branch`` output: None before the
    first commit."""
    sha = None
    dirty = False
    for line in porcelain_v2.splitlines():
        if line.startswith("# branch.oid "):
            sha = line.split()[2]
        elif line and not line.startswith("#"):
            dirty = True
    if sha is None or sha == "(initial)":
        return None
    return sha + ("-dirty" if dirty else "")


def provenance(compiled_modules: int | None = None) -> Provenance:
    """What code runs here, now; ``compiled_modules``: how many ran compiled where the run was
    computed, if not in this process (a sharded run's workers)."""
    try:
        version = metadata.version("twinserve")
    except metadata.PackageNotFoundError:
        version = None
    return Provenance(
        version=version,
        git_commit=git_commit(),
        date=dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        python=platform.python_version(),
        compiled_modules=(len(loaded_compiled_modules()) if compiled_modules is None
                          else compiled_modules),
    )
