"""Exit codes that tell the truth about lost output, and a disk that fills up mid-write.

* a broken pipe (``twinserve sweep FILE 2>&1 | head -1``, the same for ``plan`` and
  ``simulate --progress``) never exits 0: the files are complete and the status is 141;
* a closed stderr or stdout (``2>&-``) is the caller's choice: the command finishes, writes
  its files and exits 0; a full stdout (``>/dev/full``) exits 1 with one error line and the
  files complete;
* a full disk (a small tmpfs, where this machine lets the test mount one) exits 2 with one
  ``twinserve: error:`` line naming the full device, and leaves nothing half-written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.errors import UserError
from engine.output_dir import read_manifest, verify_files
from tests.faults.procs import command, environment, run_cli, survivors_of

SIM = ["simulate", "--dataset-name", "random", "--num-prompts", "200", "--random-input-len",
       "64", "--random-output-len", "16", "--request-rate", "50", "--no-plots"]
SWEEP_TOML = """name = "mini"
[base.workload]
dataset_name = "random"
num_prompts = 100
random_input_len = 64
random_output_len = 16
[grid]
"workload.request_rate" = [5, 10, 20]
"""
PLAN = ["plan", "--seeds", "1", "--max-probes", "2", "--num-prompts", "30",
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
        "--jobs", "2", "--top", "3"]


def _complete(d: Path, kind: str) -> None:
    manifest = read_manifest(d, kind)
    verify_files(d, manifest, manifest["files"])


CASES = {
    "sweep": (["sweep", "s.toml", "--jobs", "2", "--no-plots", "--out", "o"], "o", "sweep"),
    "plan": ([*PLAN, "--out", "o"], "o", "plan"),
    "simulate-progress": ([*SIM, "--num-prompts", "3000", "--progress", "--out", "o"], "o",
                          "run"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_pipe_is_not_success(tmp_path: Path, name: str) -> None:
    """``twinserve ... 2>&1 | head -1``: the reader goes after the first line."""
    args, out, kind = CASES[name]
    (tmp_path / "s.toml").write_text(SWEEP_TOML)
    tag = f"pipe-{name}-{os.getpid()}"
    proc = subprocess.Popen(command(args), cwd=tmp_path, env=environment(tag),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # head -1 exits
    rc = proc.wait(timeout=90)
    assert first, "the command printed nothing"
    assert rc == 141, rc  # 128 + SIGPIPE: a lost line is never success
    _complete(tmp_path / out, kind)  # ... and the results are whole
    assert survivors_of(tag) == []


def test_closed_stderr_is_a_choice(tmp_path: Path) -> None:
    done = run_cli([*SIM, "--out", "o"], tmp_path, stderr=None, shell_suffix="2>&-")
    assert done.rc == 0, done.stdout[-2000:]
    _complete(tmp_path / "o", "run")


def test_closed_stdout_of_a_sweep(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SWEEP_TOML)
    done = run_cli(CASES["sweep"][0], tmp_path, stdout=None, shell_suffix=">&-")
    assert done.rc == 0, done.stderr[-2000:]
    _complete(tmp_path / "o", "sweep")
    assert done.survivors == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this machine")
def test_full_stdout_keeps_the_files_and_fails(tmp_path: Path) -> None:
    done = run_cli([*SIM, "--out", "o"], tmp_path, stdout=None, shell_suffix=">/dev/full")
    assert done.rc == 1, done.stderr[-2000:]
    assert len(done.error_lines) == 1 and "stdout" in done.error_lines[0], done.stderr
    _complete(tmp_path / "o", "run")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 KiB tmpfs (root only; skipped with the reason where mounting is not allowed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: the full-disk test needs a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'}): "
                    "the full-disk test needs one")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_full_disk_refused_in_one_line(small_disk: Path, fmt: str) -> None:
    done = run_cli([*SIM, "--num-prompts", "600", "--format", fmt, "--out", str(small_disk / "o")],
                   small_disk.parent)
    assert done.rc == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert len(done.error_lines) == 1, done.stderr
    assert "no space" in done.error_lines[0].lower()
    assert os.listdir(small_disk) == []  # nothing half-written, no staging left
    assert done.survivors == []


def test_full_disk_sweep(small_disk: Path, tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SWEEP_TOML)
    done = run_cli(["sweep", "s.toml", "--jobs", "1", "--out", str(small_disk / "o")],
                   tmp_path)
    assert done.rc == 2, done.stderr[-3000:]
    assert len(done.error_lines) == 1 and "no space" in done.error_lines[0].lower()
    with pytest.raises(UserError):
        read_manifest(small_disk / "o", "sweep")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this machine")
def test_full_stderr_never_costs_the_finished_run(tmp_path: Path) -> None:
    done = run_cli([*SIM, "--progress", "--out", "o"], tmp_path, stderr=None,
                   shell_suffix="2>/dev/full")
    assert done.rc == 1  # the lost lines are not success ...
    assert "Serving Benchmark Result" in done.stdout
    _complete(tmp_path / "o", "run")  # ... and the run is kept whole
