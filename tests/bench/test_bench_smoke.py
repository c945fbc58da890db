"""Each benchmark runs end to end, small (the GPU scripts' smoke tests live beside the code they
exercise: tests/kernels, tests/worker, tests/validation)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench import identical_runs, reports, scheduler, simulator


def test_simulator_benchmark_runs_a_shortened_vidur_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert simulator.VIDUR_STREAM.is_file()
    assert simulator.main(["vidur-stream", "--num-prompts", "200"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split()[:5] == ["case", "wall", "s", "CPU", "s"]
    fields = row.split()
    assert fields[0] == "vidur-stream"
    assert float(fields[1]) > 0 and float(fields[2]) > 0  # wall and CPU seconds
    assert int(fields[7]) > 200  # more steps than requests


def test_simulator_benchmark_runs_a_peer_turn_about(capsys: pytest.CaptureFixture[str]) -> None:
    peer = f"{sys.executable} -c 'sum(range(2_000_000))'"
    assert simulator.main(["vidur-stream", "--num-prompts", "50", "--repeat", "2",
                           "--peer", peer]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [line.split()[0] for line in lines[1:-1]]
    assert names == ["vidur-stream", "peer", "peer", "vidur-stream"]  # turn about
    ours = [float(line.split()[2]) for line in lines[1:-1] if line.startswith("vidur")]
    theirs = [float(line.split()[2]) for line in lines[1:-1] if line.startswith("peer")]
    ratios = sorted(t / o for t, o in zip(theirs, ours, strict=True))
    last = lines[-1]
    assert last.startswith("CPU time, peer / vidur-stream: median ") and "2 pairs" in last
    low, high = last.split("range ")[1].split("x,")[0].split("-")
    assert float(low) == pytest.approx(ratios[0], abs=0.02)  # rows printed to 2 decimals
    assert float(high) == pytest.approx(ratios[1], abs=0.02)


def test_simulator_benchmark_refuses_bad_arguments() -> None:
    for argv in (["vidur-stream", "fleet", "--peer", "true"], ["--peer", " "],
                 ["--repeat", "0"], ["nosuchcase"]):
        with pytest.raises(SystemExit) as exc:
            simulator.main(argv)
        assert exc.value.code == 2, argv
    with pytest.raises(SystemExit, match=r"exit status 3"):
        simulator.run_side_by_side("vidur-stream", "echo broken >&2; exit 3", 1, 20, 1)


def test_each_command_is_measured_on_its_own() -> None:
    """A command's peak RSS is its own, not the largest of every command run so far (on
    Linux a child's peak starts at its parent's peak: the big one goes 1 GiB past it)."""
    own_peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    size = (own_peak_mib + 1024) << 20
    big = simulator.measure([sys.executable, "-c", f"b = bytearray({size}); b[::4096] = "
                             "b'x' * len(b[::4096])"])
    small = simulator.measure([sys.executable, "-c", "pass"])
    assert big.peak_rss_mib > small.peak_rss_mib + 512
    assert big.cpu_s > small.cpu_s > 0 and big.wall_s > 0


def test_simulator_benchmark_shards_the_fleet_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulator.main(["fleet", "--num-prompts", "400", "--shards", "2"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[1].split()
    assert row[0] == "fleet" and float(row[2]) > 0


def test_scheduler_benchmark_measures_decode_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler.main(["--steps", "12", "--sizes", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("running=4: decode steps measured=") and "us/request" in out
    assert scheduler.run(4, 12, engine_core=True)[0] > 0


def test_reports_benchmark_times_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    assert reports.main(["--num-requests", "3000", "--rate", "100"]) == 0
    out = capsys.readouterr().out
    for phase in ("synthetic EventLog", "build_columns", "summarize", "write tables (parquet)",
                  "to DataFrames", "plot latency_cdfs"):
        assert phase in out, phase


def test_identical_runs_compares_run_directories(tmp_path: Path) -> None:
    """Two runs of one build are identical (date, commit and wall time aside); a changed value
    in a table, the summary or the report is named."""
    common = ["simulate", "--no-plots", "--no-progress", "--num-prompts", "30"]
    for name in ("a", "b"):
        proc = subprocess.run(
            [sys.executable, "-m", "experiments.cli", *common, "--out", str(tmp_path / name)],
            cwd=identical_runs.ROOT, capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr
    a, b = tmp_path / "a", tmp_path / "b"
    assert identical_runs.compare_run_dirs(a, b) == []
    steps = pd.read_parquet(b / "steps.parquet")
    steps.loc[3, "cost_s"] += 1e-9
    steps.to_parquet(b / "steps.parquet", index=False)
    summary = json.loads((b / "summary.json").read_text())
    summary["completed"] += 1
    (b / "summary.json").write_text(json.dumps(summary))
    (b / "report.md").write_text((b / "report.md").read_text() + "more")
    diffs = identical_runs.compare_run_dirs(a, b)
    assert diffs[0] == "report.md: text differs"
    assert diffs[1].startswith("steps.parquet: cost_s: 1 rows (first 3), max |diff| 1e-09")
    assert diffs[2] == "summary.json: differs in completed"
    assert len(diffs) == 3
    assert set(identical_runs.CONFIGS) >= {"dp3-round-robin", "mooncake", "vidur-stream"}


def test_multiproc_executor_benchmark_compares_both_executors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import multiproc_executor

    assert multiproc_executor.main(["--smoke"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["step", "in-process", "worker"]
    assert [line.split()[0] for line in lines[1:-1]] == list(multiproc_executor.SMOKE_GRID)
    for line in lines[1:-1]:
        in_process, worker = (float(x) for x in line.split()[1:3])
        assert in_process > 0 and worker > 0
    assert lines[-1].startswith("empty step (no model work)")
    in_process, worker = (float(x) for x in lines[-1].split()[5:7])
    assert worker > in_process  # the hop through a worker process costs something
