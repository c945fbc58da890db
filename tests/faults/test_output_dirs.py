"""Issue 18, class 1: output directories are replaced whole, locked while written, and refused
by readers when they are not what their manifest says."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from engine.output_dir import OutputDir
from experiments.cli import main

SIM = ["simulate", "--dataset-name", "random", "--num-prompts", "30", "--random-input-len",
       "32", "--random-output-len", "8", "--format", "csv"]
SWEEP_TOML = """name = "mini"
[base.workload]
dataset_name = "random"
num_prompts = 30
random_input_len = 32
random_output_len = 8
[grid]
"workload.request_rate" = [5, 10]
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP_TOML)
    return tmp_path


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(lines) == 1, lines
    return lines[0]


def test_rerun_replaces_the_directory_whole(workdir: Path) -> None:
    assert main([*SIM, "--out", "r"]) == 0
    assert list((workdir / "r" / "plots").glob("*.png"))
    (workdir / "r" / "extra_from_old_run.json").write_text("{}")
    assert main([*SIM, "--no-plots", "--out", "r"]) == 0
    assert not (workdir / "r" / "plots").exists()
    assert not (workdir / "r" / "extra_from_old_run.json").exists()
    assert sorted(p.name for p in workdir.iterdir()) == ["r", "s.toml"]  # no staging, no lock


def test_report_no_plots_leaves_no_old_plots(workdir: Path) -> None:
    assert main([*SIM, "--out", "r"]) == 0
    assert main(["report", "r", "--no-plots"]) == 0
    assert not list(workdir.glob("r/plots/*.png"))


@pytest.mark.parametrize("damage", ["cut-table", "other-config", "mixed-formats", "no-manifest"])
def test_readers_refuse_a_damaged_run(workdir: Path, capsys: pytest.CaptureFixture[str],
                                      damage: str) -> None:
    assert main([*SIM, "--no-plots", "--seed", "0", "--out", "a"]) == 0
    assert main([*SIM, "--no-plots", "--seed", "1", "--out", "b"]) == 0
    run = workdir / "a"
    if damage == "cut-table":
        lines = (run / "requests.csv").read_text().splitlines(keepends=True)
        (run / "requests.csv").write_text("".join(lines[: len(lines) // 2]))
    elif damage == "other-config":
        (run / "config.json").write_text((workdir / "b" / "config.json").read_text())
    elif damage == "mixed-formats":
        assert main([*SIM[:-2], "--no-plots", "--out", "pq"]) == 0
        (workdir / "pq" / "steps.parquet").rename(run / "steps.parquet")
    else:
        (run / "manifest.json").unlink()
    capsys.readouterr()
    assert main(["report", "a", "--no-plots"]) == 2
    assert "a" in _error(capsys)
    assert main(["compare", "b", "a", "--out", "c", "--no-plots"]) == 2
    _error(capsys)
    assert not (workdir / "c").exists()


def test_report_rebuilds_a_summary_cut_short(workdir: Path) -> None:
    assert main([*SIM, "--no-plots", "--out", "r"]) == 0
    before = json.loads((workdir / "r" / "summary.json").read_text())
    (workdir / "r" / "summary.json").write_text('{"completed": 3')
    assert main(["report", "r", "--no-plots"]) == 0
    after = json.loads((workdir / "r" / "summary.json").read_text())
    assert {k: v for k, v in after.items() if k != "date"} == {
        k: v for k, v in before.items() if k != "date"}


@pytest.mark.parametrize("argv", [
    [*SIM, "--no-plots", "--out", "busy"],
    ["sweep", "s.toml", "--jobs", "1", "--no-plots", "--out", "busy"],
    ["plan", "--seeds", "1", "--max-probes", "2", "--num-prompts", "20", "--jobs", "1",
     "--out", "busy"],
], ids=["simulate", "sweep", "plan"])
def test_a_second_writer_is_refused(workdir: Path, capsys: pytest.CaptureFixture[str],
                                    argv: list[str]) -> None:
    kind = {"simulate": "run", "sweep": "sweep", "plan": "plan"}[argv[0]]
    with OutputDir(workdir / "busy", kind) as first:
        capsys.readouterr()
        assert main(argv) == 2
        assert "being written by another twinserve process" in _error(capsys)
        first.abort()


def test_sweep_save_runs_then_without(workdir: Path) -> None:
    base = ["sweep", "s.toml", "--jobs", "1", "--no-plots", "--no-progress", "--out", "o"]
    assert main([*base, "--save-runs"]) == 0
    assert len(list((workdir / "o" / "runs").iterdir())) == 2
    assert main(base) == 0
    assert not (workdir / "o" / "runs").exists()
    assert (workdir / "o" / "cache").is_dir()  # the cache survives the replacement


@pytest.mark.parametrize("damage", ["no-metrics", "cut", "other-task"])
def test_a_damaged_cache_record_is_run_again(workdir: Path, capsys: pytest.CaptureFixture[str],
                                             damage: str) -> None:
    base = ["sweep", "s.toml", "--jobs", "1", "--no-plots", "--no-progress", "--out", "o"]
    assert main(base) == 0
    first = _results(workdir / "o")
    entry_path = sorted((workdir / "o" / "cache").glob("*.json"))[0]
    entry = json.loads(entry_path.read_text())
    if damage == "no-metrics":
        entry["record"] = {k: v for k, v in entry["record"].items() if "ttft" not in k}
        entry_path.write_text(json.dumps(entry))
    elif damage == "cut":
        entry_path.write_text(entry_path.read_text()[:100])
    else:
        entry["task"]["config"]["workload"]["num_prompts"] = 7
        entry_path.write_text(json.dumps(entry))
    capsys.readouterr()
    assert main(base) == 0
    assert "1 run, 1 cached" in capsys.readouterr().err
    pd.testing.assert_frame_equal(_results(workdir / "o"), first)


def _results(d: Path) -> pd.DataFrame:
    df = pd.read_csv(d / "results.csv")
    return df.drop(columns=["wall_time_s"])
