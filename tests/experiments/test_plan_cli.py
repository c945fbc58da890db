"""``twinserve plan`` end to end on a tiny workload, and its one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main

TINY = ["--dataset-name", "random", "--num-prompts", "30", "--random-input-len", "256",
        "--random-output-len", "16", "--seeds", "1", "--tolerance", "0.3", "--max-probes", "6",
        "--rate-start", "8", "-j", "1"]


def test_plan_writes_ranked_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    rc = main(["plan", "--gpus", "h100-sxm", "a100-80gb", "--knob", "max_num_seqs=4,64",
               "--slo", "ttft:200", "tpot:40", "--gpu-price", "h100-sxm=2.5",
               "--out", str(out), *TINY])
    assert rc == 0
    df = pd.read_csv(out / "plan.csv")
    assert len(df) == 4 and list(df["rank"]) == [1, 2, 3, 4]
    assert {"engine.max_num_seqs", "max_rate", "gpu_hours_per_million_requests"} <= set(df)
    assert set(df["status"]) <= {"ok", "unbounded", "infeasible"}
    h100 = df[df["gpu"] == "h100-sxm"]
    assert h100["usd_per_million_requests"].notna().all()
    assert (pd.read_csv(out / "probes.csv")["attainment"].between(0, 1)).all()
    text = (out / "plan.md").read_text()
    assert "# Capacity plan" in text and "| rank | candidate |" in text
    printed = capsys.readouterr()
    assert "| rank | candidate |" in printed.out and "4 candidate(s)" in printed.err


@pytest.mark.parametrize("args, message", [
    (["--request-rate", "5"], "plan searches the request rate"),
    (["--slo", "latency:5"], "invalid goodput"),
    (["--knob", "max_num_seqz=4"], "unknown key 'max_num_seqz'"),
    (["--knob", "max_num_seqs"], "invalid --knob"),
    (["--gpu-price", "b200=9"], "--gpu-price for GPU(s) not planned: b200"),
    (["--attainment", "0"], "attainment must be in (0, 1]"),
    (["--gpus", "tpu-v5"], "unknown GPU 'tpu-v5'; valid: a100-40gb, a100-80gb, b200"),
    (["--tp", "3"], "TP sizes must be powers of two, got [3]"),
    (["--target-rate", "inf"], "target rate must be a finite number > 0, got inf"),
    (["--top", "0"], "--top must be >= 1, got 0"),
    (["--gpu-price", "h100-sxm=nan"], "invalid --gpu-price 'h100-sxm=nan'"),
    (["--knob", "workload.request_rate=1,2"], "plan searches the request rate"),
])
def test_bad_plan_input_is_one_line(args: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "h100-sxm", *args, *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinserve: error: ") and message in err


def test_a_plan_where_no_candidate_can_run_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "a100-80gb",
               "--slo", "ttft:500", "--out", str(tmp_path / "plan"), *TINY])
    err = capsys.readouterr().err
    assert rc == 2
    assert "twinserve: error: no candidate layout can run (a100-80gb tp1 dp1: " in err
    assert "does not fit" in err and (tmp_path / "plan" / "plan.md").exists()


@pytest.mark.parametrize("args, message", [
    (["--seeds", str(10**20)], "--seeds must be in [1, 1000]"),
    (["-j", "100000"], "--jobs must be <= 1024, got 100000"),
])
def test_oversized_counts_are_refused(args: list[str], message: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # after TINY, so that these values win over its --seeds 1 and -j 1
    assert main(["plan", "--gpus", "h100-sxm", "--out", str(tmp_path), *TINY, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinserve: error: ") and message in err


def test_plan_searches_pipeline_layouts(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    rc = main(["plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "h100-sxm",
               "--tp", "4", "--pp", "1", "2", "--slo", "ttft:2000", "tpot:100",
               "--out", str(out), *TINY])
    assert rc == 0
    df = pd.read_csv(out / "plan.csv")
    assert sorted(df["pipeline_parallel_size"]) == [1, 2]
    assert sorted(df["num_gpus"]) == [4, 8]
    assert set(df["candidate"]) == {"h100-sxm tp4 dp1", "h100-sxm tp4 pp2 dp1"}
    assert set(df["status"]) <= {"ok", "unbounded", "infeasible"}
