"""``twinserve profile`` / ``twinserve validate`` at a tiny scale: structure, not accuracy
(accuracy is a benchmark figure: docs/validation.md)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from experiments.cli.cmd_validate import main, register
from experiments.validation.report import METRICS

WORKLOAD = ["--num-prompts", "8", "--random-input-len", "24", "--random-output-len", "4",
            "--random-range-ratio", "0.5"]


def test_register_adds_both_subcommands() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["validate", "--model", "m", "--out", "o", "--loads", "0.1,0.5"])
    assert args.loads == "0.1,0.5" and args.dataset_name == "random"
    args = parser.parse_args(["profile", "--out", "p.csv", "--refit"])
    assert args.refit and args.statistic == "mean"


@pytest.fixture(scope="module")
def validated(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("validate")
    assert main(["validate", "--model", str(tiny_model), "--device", "cpu",
                 "--kv-cache-memory", "2MiB", "--grid", "quick", *WORKLOAD,
                 "--load-fraction", "0.5", "--speed-correct", "--in-process", "--repeats", "1",
                 "--out", str(out)]) == 0
    return out


def check_validation_json(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    assert set(result["metrics"]) == set(METRICS)
    for metric in METRICS:
        stats = result["metrics"][metric]
        assert set(stats) == {"mean", "p50", "p90", "p99"}
        assert all(v is None or math.isfinite(v) for v in stats.values())
    assert math.isfinite(result["throughput"])
    assert result["step_time"]["median_abs_rel_err"] >= 0
    assert result["diagnosis"] and isinstance(result["diagnosis"][0], str)
    return result


def test_validate_writes_the_whole_output_directory(validated: Path) -> None:
    names = {p.name for p in validated.iterdir()}
    assert {"measured", "simulated", "compare", "validation.json", "validation.md",
            "step_time_scatter.png", "profile.csv", "profile.meta.json",
            "profile.fitted.json"} <= names
    assert (validated / "measured" / "step_shapes.csv").exists()
    assert (validated / "compare" / "compare_cdfs.png").exists()
    result = check_validation_json(validated / "validation.json")
    assert result["contention"]["speed_drift"] > 0
    assert (validated / "simulated_speed_corrected" / "config.json").exists()
    assert set(result["speed_corrected"]["metrics"]) == set(METRICS)
    assert result["load_fraction"] == 0.5
    assert result["request_rate"] == pytest.approx(0.5 * result["capacity_rps"])
    md = (validated / "validation.md").read_text()
    assert "| this run | TTFT |" in md and "Which stage misses" in md
    # the wake-up probe was measured, fitted and handed to the simulation
    wakeup = json.loads((validated / "profile.fitted.json").read_text())["frontend"]["idle_wakeup"]
    assert wakeup["num_rows"] == 6 and wakeup["extra_s"] >= 0
    simulated = json.loads((validated / "simulated" / "config.json").read_text())["config"]
    assert simulated["frontend"]["idle_wakeup_s"] == wakeup["extra_s"]
    assert simulated["frontend"]["idle_wakeup_ramp_s"] == wakeup["ramp_s"]


def test_measured_and_simulated_runs_serve_the_same_request_stream(validated: Path) -> None:
    from reports.run_dir import load_run_dir

    m_meta, m = load_run_dir(validated / "measured")
    s_meta, s = load_run_dir(validated / "simulated")
    assert (m_meta["kind"], s_meta["kind"]) == ("real", "simulated")
    for col in ("arrival_s", "num_prompt_tokens", "num_output_tokens"):
        assert m.requests[col].tolist() == pytest.approx(s.requests[col].tolist())
    assert s_meta["config"]["num_gpu_blocks"] == m_meta["engine_config"]["cache"]["num_gpu_blocks"]
    assert s_meta["config"]["engine"]["async_scheduling"] is False
    assert s_meta["config"]["frontend"]["ipc_latency_s"] == 0.0


def test_reusing_a_measured_run_directory(validated: Path, tmp_path: Path) -> None:
    assert main(["validate", "--reuse-measured", str(validated / "measured"), "--profile",
                 str(validated / "profile.csv"), "--no-plots", "--out", str(tmp_path)]) == 0
    check_validation_json(tmp_path / "validation.json")


def test_profile_refit_prints_the_fit(validated: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    for name in ("profile.csv", "profile.meta.json"):
        shutil.copy(validated / name, tmp_path / name)
    assert main(["profile", "--refit", "--statistic", "median",
                 "--out", str(tmp_path / "profile.csv")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["fit"]["statistic"] == "median"
    assert (tmp_path / "profile.fitted.json").exists()
    assert main(["profile", "--refit", "--out", str(tmp_path / "missing.csv")]) == 2


def test_event_log_bundle_round_trip(tiny_model: Path, tmp_path: Path) -> None:
    from engine.llm import EngineArgs
    from experiments.validation import runs
    from reports.tables import build_tables
    from workload.config import WorkloadConfig

    engine = EngineArgs(model=str(tiny_model), device="cpu", kv_cache_memory=2 << 20).build()
    cfg = WorkloadConfig(num_prompts=5, request_rate=200.0, random_input_len=20,
                         random_output_len=3, seed=7)
    run = runs.serve_measured(engine, cfg)
    assert len(runs.shapes_from_rows(run.step_rows)) > 0
    back = runs.read_bundle(runs.write_bundle(run, tmp_path / "measured_x.json"))
    original, loaded = build_tables(run.log), build_tables(back.log)
    for name in ("requests", "steps", "token_runs"):
        a, b = getattr(original, name), getattr(loaded, name)
        assert a.shape == b.shape
        assert a.astype(str).equals(b.astype(str)), name
    assert back.meta == run.meta and back.step_rows == run.step_rows


def test_gpu_script_smoke_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.gpu_validate import main as gpu_main

    assert gpu_main(["--smoke", "--out", str(tmp_path), "--num-prompts", "4",
                     "--loads", "0.2,0.8"]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"profile.csv", "profile.meta.json", "profile.fitted.json", "measured_0.20.json",
            "measured_0.80.json"} <= names
    assert len(names - {"validation"}) <= 8  # what a device run can bring back
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("| measured_0.80 | step time")  # the error table comes last
    summary = json.loads((tmp_path / "validation" / "validation_summary.json").read_text())
    assert set(summary["loads"]) == {"measured_0.20", "measured_0.80"}
