"""``twinserve validate`` on the served path at a tiny scale: structure, not accuracy.

One real ``twinserve serve`` process tree is profiled in place, calibrated, measured by
``bench serve`` at two loads (each run twice), stopped; every run is joined with the server's
records, the model is fitted, each identical stream simulated with the fitted model and with
the measured steps replayed, and the report written.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli.cmd_validate import main
from reports.run_dir import load_run_dir
from tests.serve.server import descendants

WORKLOAD = ["--num-prompts", "12", "--random-input-len", "24", "--random-output-len", "6",
            "--random-range-ratio", "0.5"]
METRICS = ("ttft", "tpot", "itl", "e2el")


@pytest.fixture(scope="module")
def validated(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("served-validate")
    assert main(["validate", "--model", str(tiny_model), "--device", "cpu",
                 "--kv-cache-memory", "2MiB", "--grid", "quick", *WORKLOAD, "--loads", "0.3,0.8",
                 "--repeats", "2", "--calibration", "1,4", "--no-plots", "--out", str(out)]) == 0
    return out


def test_the_server_is_gone_and_left_its_records(validated: Path) -> None:
    assert not descendants(os.getpid())
    assert (validated / "server" / "records" / "engine-0.pkl").exists()
    assert (validated / "step_shapes.csv").exists()
    meta = json.loads((validated / "profile.meta.json").read_text())
    assert meta["profiled_in"] == "the server's EngineCore process" and meta["num_grid_shapes"]
    profile = pd.read_csv(validated / "profile.csv")
    assert {"step", "in_loop", "wakeup"} <= set(profile["name"])
    served = json.loads((validated / "served_costs.json").read_text())["frontend_config"]
    assert served["ipc_latency_s"] > 0 and served["request_overhead_s"] > 0
    assert served["schedule_overhead_s"] >= 0 and served["num_api_servers"] == 1


def test_each_load_is_measured_twice_and_simulated_twice(validated: Path) -> None:
    summary = json.loads((validated / "validation_summary.json").read_text())
    assert set(summary["loads"]) == {"load-0.3", "load-0.8"}
    capacity = summary["capacity_rps"]
    for label, fraction in (("load-0.3", 0.3), ("load-0.8", 0.8)):
        d = validated / label
        res = json.loads((d / "validation.json").read_text())
        assert res["request_rate"] == pytest.approx(fraction * capacity)
        for twin in ("replayed", "fitted"):
            for m in METRICS:
                for stat in ("mean", "p50", "p90", "p99"):
                    assert math.isfinite(res["errors"][twin][m][stat])
        assert all(res["noise_floor"][m]["p50"] is not None for m in METRICS)
        assert res["replay_steps"]["replayed"] > 0
        assert res["clock_alignment"] == "shared clock"
        assert res["findings"] and "Noise floor" in " ".join(res["findings"])
        segments = {r["segment"] for r in res["stages"]["segments"]}
        assert {"prefill steps", "decode steps"} <= segments
        text = (d / "validation.md").read_text()
        assert "| TTFT | p99 |" in text and "## Stages" in text
    top = (validated / "validation.md").read_text()
    assert "replayed" in top and "| load-0.8 | E2EL | p50 |" in top


def test_measured_replayed_and_fitted_runs_serve_the_same_stream(validated: Path) -> None:
    d = validated / "load-0.8"
    m_meta, m = load_run_dir(d / "measured")
    _, again = load_run_dir(d / "measured_repeat")
    r_meta, r = load_run_dir(d / "replayed")
    f_meta, f = load_run_dir(d / "simulated")
    assert m_meta["steps"] == "engine" and m_meta["kind"] == "real"
    assert (r_meta["kind"], f_meta["kind"]) == ("simulated", "simulated")
    lens = m.requests["num_prompt_tokens"].tolist()
    assert len(lens) == 12
    assert lens == again.requests["num_prompt_tokens"].tolist()
    for twin in (r, f):
        assert lens == twin.requests["num_prompt_tokens"].tolist()
    assert (m.requests["num_output_tokens"] == f.requests["num_output_tokens"]).all()
    assert f_meta["config"]["engine"]["async_scheduling"] is False
    assert f_meta["config"]["num_gpu_blocks"] == m_meta["engine_config"]["cache"]["num_gpu_blocks"]
    assert r_meta["config"]["frontend"]["idle_wakeup_s"] == 0.0
    # every measured stage of the served path is in the joined run directory
    assert m.requests[["frontend_start_s", "tokenized_s", "engine_enqueued_s"]].notna().all().all()


def test_gpu_script_smoke_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.gpu_validate_serve import COPIED
    from bench.gpu_validate_serve import main as gpu_main

    assert gpu_main(["--smoke", "--out", str(tmp_path)]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {*COPIED, "runs.tar.gz"} and len(names) <= 8  # what a device run returns
    summary = json.loads((tmp_path / "validation_summary.json").read_text())
    assert set(summary["loads"]) == {"load-0.5"}
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("| load-0.5 | throughput |")  # the error table comes last
    assert not descendants(os.getpid())
