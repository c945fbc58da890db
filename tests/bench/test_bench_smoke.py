"""Each benchmark runs end to end, small (the GPU scripts' smoke tests live beside the code they
exercise: tests/kernels, tests/worker, tests/validation)."""

from __future__ import annotations

import pytest

from bench import reports, scheduler, simulator


def test_simulator_benchmark_runs_a_shortened_vidur_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert simulator.VIDUR_STREAM.is_file()
    assert simulator.main(["vidur-stream", "--num-prompts", "200"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split()[:2] == ["case", "wall"]
    fields = row.split()
    assert fields[0] == "vidur-stream"
    assert float(fields[1]) > 0 and int(fields[6]) > 200  # wall s > 0; more steps than requests


def test_scheduler_benchmark_measures_decode_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler.main(["--steps", "12", "--sizes", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("running=4: decode steps measured=") and "us/request" in out
    assert scheduler.run(4, 12, engine_core=True)[0] > 0


def test_reports_benchmark_times_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    assert reports.main(["--num-requests", "3000", "--rate", "100"]) == 0
    out = capsys.readouterr().out
    for phase in ("synthetic EventLog", "build_tables", "summarize", "plot latency_cdfs",
                  "write tables (parquet)"):
        assert phase in out, phase


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
