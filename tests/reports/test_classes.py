"""Results by tenant and SLO class (``reports.classes``), on a hand-made requests table, and in
a run directory's summary, report and sweep record."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.classes import flat_group_metrics, group_breakdown
from reports.tables import RunTables

META = {"config": {"workload": {"slo_classes": [["chat", 100, 20], ["batch", 1000, 100]]}}}


def _tables(rows: list[dict]) -> RunTables:
    req = pd.DataFrame(rows)
    for c in ("tenant", "slo_class"):
        req[c] = pd.Categorical(req[c])
    return RunTables(req, pd.DataFrame(), pd.DataFrame())


def _row(tenant: str, cls: str, ttft: float, tpot: float, *, ok: bool = True,
         rejected: bool = False, n_out: int = 5) -> dict:
    return {"tenant": tenant, "slo_class": cls, "success": ok,
            "rejected_s": 1.0 if rejected else math.nan, "num_output_tokens": n_out if ok else 0,
            "ttft_s": ttft if ok else math.nan, "tpot_s": tpot if ok else math.nan,
            "e2el_s": ttft + 4 * tpot if ok else math.nan}


def test_each_group_counts_its_rejections_and_misses_against_its_own_slo() -> None:
    tables = _tables([
        _row("a", "chat", 0.05, 0.010),  # meets chat (100 ms, 20 ms)
        _row("a", "chat", 0.15, 0.010),  # TTFT misses
        _row("a", "chat", 0, 0, ok=False, rejected=True),  # shed: a miss
        _row("b", "batch", 0.50, 0.050),  # meets batch (1000 ms, 100 ms)
        _row("b", "batch", 0.90, 0.150),  # TPOT misses
        _row("b", "", 0.05, 0.010),  # no class and no goodput SLOs: no SLO applies
    ])
    got = group_breakdown(tables, META, {}, duration_s=2.0)
    chat = got["by_slo_class"]["chat"]
    assert (chat["num_requests"], chat["completed"], chat["rejected"], chat["failed"]) == (
        3, 2, 1, 0)
    assert chat["slo_attainment"] == 1 / 3 and chat["goodput"] == 0.5
    assert chat["median_ttft_ms"] == 100.0 and chat["p99_ttft_ms"] == np.percentile([50, 150], 99)
    batch = got["by_slo_class"]["batch"]
    assert batch["slo_attainment"] == 0.5 and batch["goodput"] == 0.5
    assert got["by_slo_class"][""]["slo_attainment"] is None  # no SLO applies to them
    a, b = got["by_tenant"]["a"], got["by_tenant"]["b"]
    assert (a["rejected"], a["slo_attainment"]) == (1, 1 / 3)
    assert b["slo_attainment"] is None  # one of b's requests has no SLO
    # with the run's goodput SLOs, unclassed requests are held to them
    with_goodput = group_breakdown(tables, META, {"ttft": 60.0}, duration_s=2.0)
    assert with_goodput["by_slo_class"][""]["slo_attainment"] == 1.0
    assert with_goodput["by_tenant"]["b"]["slo_attainment"] == 2 / 3
    flat = flat_group_metrics(got)
    assert flat["class_chat_rejected"] == 1 and flat["tenant_b_num_requests"] == 3


def test_a_run_without_labels_has_no_breakdown() -> None:
    req = pd.DataFrame([_row("a", "x", 0.1, 0.01)]).drop(columns=["tenant", "slo_class"])
    assert group_breakdown(RunTables(req, pd.DataFrame(), pd.DataFrame()), META, {}, 1.0) == {}


def test_the_summary_report_and_sweep_record_show_the_groups(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from experiments.sweep.records import simulate_record
    from reports.run_dir import load_run_dir

    config = {
        "model": "meta-llama/Llama-3.1-8B",
        "engine": {"policy": "shed", "max_num_seqs": 4},
        "workload": {"dataset_name": "random", "num_prompts": 60, "request_rate": 200,
                     "random_input_len": 1500, "random_output_len": 20,
                     "tenant_mix": [["a", 0.5], ["b", 0.5]],
                     "slo_classes": [["chat", 80, 40], ["batch", 60000, 200]],
                     "slo_class_mix": [["chat", 0.5], ["batch", 0.5]]},
    }
    record = simulate_record(config, {"goodput": {}}, run_dir=str(tmp_path / "run"))
    assert record["class_chat_rejected"] > 0 and record["class_batch_rejected"] == 0
    assert record["class_batch_slo_attainment"] == 1.0
    assert record["tenant_a_num_requests"] + record["tenant_b_num_requests"] == 60
    meta, tables = load_run_dir(tmp_path / "run")
    assert meta["scheduling_policy"]["name"] == "shed"
    assert set(tables.requests["slo_class"].astype(str)) == {"chat", "batch"}
    assert len(meta["reject_reasons"]) == record["class_chat_rejected"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## By tenant and SLO class" in report and "| class chat |" in report
