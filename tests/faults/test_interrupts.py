"""Kill ``simulate``, ``sweep`` and ``plan`` at random points, then read what they left.

For each command and each of SIGINT, SIGTERM and SIGKILL, sent at a moment drawn from a seeded
random generator (or as the run directory's staging area appears, to land in the write phase):

* the exit status is the signal's (128 + N, or death by SIGKILL), or 0 if it had finished;
* nothing the command started survives it (``procs.survivors_of``: the orphan check);
* every reader either refuses the output directory with one error, or finds it complete and
  equal to an uninterrupted run — a rerun into an old directory leaves the old run or the new
  one, never a mixture; a sweep or a plan rerun after the interruption equals an uninterrupted
  one.
"""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path

import pandas as pd
import pytest

from engine.core.errors import UserError
from engine.output_dir import read_manifest, verify_files
from experiments.cli import main
from reports.run_dir import load_run_dir
from tests.faults.procs import Finished, run_cli

SIM = ["simulate", "--dataset-name", "random", "--num-prompts", "600", "--random-input-len",
       "64", "--random-output-len", "16", "--request-rate", "50", "--no-plots",
       "--format", "csv"]
SWEEP_TOML = """name = "mini"
[base.workload]
dataset_name = "random"
num_prompts = 300
random_input_len = 64
random_output_len = 16
[grid]
"workload.request_rate" = [5, 10, 20, 40]
"""
SWEEP = ["sweep", "s.toml", "--jobs", "2", "--no-plots", "--no-progress"]
PLAN = ["plan", "--seeds", "1", "--max-probes", "3", "--num-prompts", "100",
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
        "--jobs", "2", "--top", "3", "--tp", "1", "2"]
#: Columns that differ between identical runs (wall clock, build).
VOLATILE = {"version", "git_commit", "wall_time_s", "cache_key", "date", "sim_wall_s"}
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
RNG = random.Random(18)


def _ok_status(done: Finished, sig: int) -> None:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.rc in (0, 128 + sig, -sig), (done.rc, done.stderr[-2000:])
    if done.rc == 128 + sig:  # stopped in order (-sig: the signal came as it exited)
        assert "interrupted" in done.stderr, done.stderr[-2000:]
        assert done.exit_after_signal_s is not None and done.exit_after_signal_s < 5.0
    assert done.survivors == [], f"processes outlived the command: {done.survivors}"


def _same_run(d: Path, ref: Path) -> bool:
    """Whether run directory ``d`` holds the run of ``ref`` (tables equal, config equal up to
    the date)."""
    meta, tables = load_run_dir(d)
    ref_meta, ref_tables = load_run_dir(ref)
    if _stable(meta) != _stable(ref_meta):
        return False
    for name in ("requests", "steps", "token_runs"):
        if not getattr(tables, name).equals(getattr(ref_tables, name)):
            return False
    return True


def _stable(value: object) -> object:
    """``value`` without the keys that differ between identical runs, at any depth."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _check_run_dir(d: Path, accept: list[Path]) -> str:
    """'refused', or the reference the complete directory ``d`` equals; fails otherwise."""
    try:
        load_run_dir(d)
    except UserError as exc:
        assert "\n" not in str(exc)
        # the CLI reader says so in one line too
        assert main(["report", str(d), "--no-plots"]) == 2
        return "refused"
    for ref in accept:
        if _same_run(d, ref):
            return ref.name
    raise AssertionError(f"{d} reads as complete but equals none of {accept}")


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("refs")
    (root / "s.toml").write_text(SWEEP_TOML)
    out: dict[str, Path] = {}
    for name, args in (("seed0", [*SIM, "--seed", "0"]), ("seed1", [*SIM, "--seed", "1"]),
                       ("sweep", SWEEP), ("plan", PLAN)):
        assert _main_in(root, [*args, "--out", name]) == 0
        out[name] = root / name
    return out


def _main_in(cwd: Path, args: list[str]) -> int:
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return main(args)
    finally:
        os.chdir(old)


def _table(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    return df.drop(columns=[c for c in df.columns if c in VOLATILE])


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("over", [False, True], ids=["fresh", "rerun"])
def test_simulate_killed(refs: dict[str, Path], tmp_path: Path, sig: int, over: bool) -> None:
    out = tmp_path / "out"
    if over:  # a rerun (seed 0) into the directory of an earlier run (seed 1)
        shutil.copytree(refs["seed1"], out)
        when = [tmp_path / ".out.partial-*"]  # the write phase
        after = None
    else:
        when, after = [], RNG.uniform(0.5, 4.0)
    done = run_cli([*SIM, "--seed", "0", "--out", "out"], tmp_path, sig=sig, after_s=after,
                   when_exists=when)
    _ok_status(done, sig)
    accept = [refs["seed0"], refs["seed1"]] if over else [refs["seed0"]]
    if not out.exists():
        assert not over, "the rerun removed the earlier run"
        return
    found = _check_run_dir(out, accept)
    if done.rc == 0:
        assert found == "seed0"
    if over:
        assert found != "refused", "an interrupted rerun must leave the old run whole"
    # what a killed writer left does not block the next one, which replaces it whole
    assert _main_in(tmp_path, [*SIM, "--seed", "0", "--out", "out"]) == 0
    assert _check_run_dir(out, [refs["seed0"]]) == "seed0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _check_results(d: Path, kind: str, table: str, ref: Path) -> str:
    try:
        manifest = read_manifest(d, kind)
        verify_files(d, manifest, manifest["data"])
    except UserError:
        return "refused"
    pd.testing.assert_frame_equal(_table(d / table), _table(ref / table))
    return "complete"


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_sweep_killed_then_resumed(refs: dict[str, Path], tmp_path: Path, sig: int) -> None:
    (tmp_path / "s.toml").write_text(SWEEP_TOML)
    done = run_cli([*SWEEP, "--out", "o"], tmp_path, sig=sig, after_s=RNG.uniform(1.0, 4.0),
                   to_group=sig == signal.SIGINT)  # Ctrl-C reaches the terminal's group
    _ok_status(done, sig)
    if (tmp_path / "o").exists():
        _check_results(tmp_path / "o", "sweep", "results.csv", refs["sweep"])
    assert _main_in(tmp_path, [*SWEEP, "--out", "o"]) == 0
    assert _check_results(tmp_path / "o", "sweep", "results.csv", refs["sweep"]) == "complete"


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_plan_killed_then_rerun(refs: dict[str, Path], tmp_path: Path, sig: int) -> None:
    done = run_cli([*PLAN, "--out", "o"], tmp_path, sig=sig, after_s=RNG.uniform(1.0, 4.0),
                   to_group=sig == signal.SIGINT)
    _ok_status(done, sig)
    if (tmp_path / "o").exists():
        _check_results(tmp_path / "o", "plan", "plan.csv", refs["plan"])
    assert _main_in(tmp_path, [*PLAN, "--out", "o"]) == 0
    assert _check_results(tmp_path / "o", "plan", "plan.csv", refs["plan"]) == "complete"


def test_ctrl_c_stops_a_plan_mid_probe(tmp_path: Path) -> None:
    """Ctrl-C while probe threads wait on pool workers: out within seconds, no orphans (the
    interpreter must not join threads waiting on cancelled work)."""
    slow = [*PLAN[:PLAN.index("--num-prompts") + 1], "30000",
            *PLAN[PLAN.index("--num-prompts") + 2:]]
    done = run_cli([*slow, "--out", "o"], tmp_path, sig=signal.SIGINT, after_s=2.5,
                   to_group=True)
    _ok_status(done, signal.SIGINT)
    assert done.rc == 128 + signal.SIGINT, done.stderr[-2000:]
