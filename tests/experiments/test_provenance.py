"""The git commit stamped into run directories, read from one ``git status``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from experiments.provenance import commit_from_status, git_commit

ROOT = Path(__file__).resolve().parents[2]
SHA = "d6c9789fd911ad1a9916512a5510ee06368d61e3"


def test_a_clean_checkout_is_its_commit() -> None:
    assert commit_from_status(f"# branch.oid {SHA}\n# branch.head main\n") == SHA


def test_a_changed_tracked_file_makes_it_dirty() -> None:
    status = (f"# branch.oid {SHA}\n# branch.head main\n"
              "1 .M N... 100644 100644 100644 aaaa bbbb sim/config.py\n")
    assert commit_from_status(status) == SHA + "-dirty"


def test_no_commit_yet_is_none() -> None:
    assert commit_from_status("# branch.oid (initial)\n# branch.head main\n") is None
    assert commit_from_status("") is None


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="not a git checkout")
def test_this_checkout_reads_as_git_says() -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no") != ""
    assert git_commit() == git("rev-parse", "HEAD") + ("-dirty" if dirty else "")
