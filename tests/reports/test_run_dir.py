"""Run directories: write → load → the same summary; rebuild keeps options; compare; plots."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from reports.compare import compare_runs
from reports.errors import ReportError
from reports.meta import read_json, to_jsonable
from reports.metrics import summarize
from reports.plots import plot_rate_sweep
from reports.run_dir import load_run_dir, rebuild_report, write_run_dir
from reports.timeseries import bin_steps
from tests.reports.logs import known_log

META = {"kind": "simulated", "label": "known", "seed": 7, "version": "0.1.0",
        "git_commit": "abc123", "config": {"model": "m", "workload": {"request_rate": 2.0}},
        "engine_config": {"scheduler": {"max_num_batched_tokens": 8}},
        "stats": {"api_server_busy_s": 0.3, "output_processor_busy_s": np.float64(0.1)}}
OPTS = {"goodput": {"ttft": 2000.0}, "percentiles": [50, 99], "percentile_metrics": ["ttft",
                                                                                      "e2el"]}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    summary = write_run_dir(d, known_log(), META, plots=True, **OPTS)
    return d, summary


def _plain(x):
    return json.loads(json.dumps(to_jsonable(x)))


def test_layout(run_dir):
    d, summary = run_dir
    for name in ("config.json", "summary.json", "report.md", "report.html",
                 "requests.parquet", "steps.parquet", "token_runs.parquet"):
        assert (d / name).stat().st_size > 0, name
    pngs = sorted(p.name for p in (d / "plots").glob("*.png"))
    assert pngs == ["batch_composition.png", "breakdown.png", "kv_and_queues.png",
                    "latency_cdfs.png"]
    for p in (d / "plots").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert read_json(d / "summary.json") == _plain(summary)
    meta = read_json(d / "config.json")
    assert meta["seed"] == 7 and meta["git_commit"] == "abc123" and "date" in meta
    assert summary["seed"] == 7 and summary["version"] == "0.1.0" and summary["label"] == "known"


def test_report_contents(run_dir):
    d, summary = run_dir
    md = (d / "report.md").read_text()
    html = (d / "report.html").read_text()
    for text in ("Serving Benchmark Result", "Diagnosis: ", "Where the time went",
                 "Engine statistics", "waiting: KV blocks", summary["diagnosis"]["text"][:40]):
        assert text in md, text
    assert "![Latency CDFs" in md and "plots/latency_cdfs.png" in md
    assert html.count("data:image/png;base64,") == 4  # self-contained
    assert "src='plots/" not in html and "<table>" in html


@pytest.mark.parametrize("file_format", ["parquet", "csv"])
def test_round_trip_gives_the_same_summary(tmp_path, file_format):
    summary = write_run_dir(tmp_path, known_log(), META, plots=False, file_format=file_format,
                            **OPTS)
    meta, tables = load_run_dir(tmp_path)
    again = summarize(tables, meta, **OPTS)
    assert _plain(again) == _plain(summary)
    assert list(tmp_path.glob(f"*.{file_format}")) and not (tmp_path / "plots").exists()
    assert tables.requests["req_id"].tolist() == ["a", "c", "b", "d"]


def test_csv_text_columns_empty_throughout_read_back_as_empty_labels(tmp_path):
    """A CSV column of "" only (no step ever blocked, no tenants) comes back as NaN floats
    from pandas: it is read as the category "" without a warning (pandas deprecates filling
    a float column with text)."""
    import warnings

    from reports.run_dir import _read_table_file

    path = tmp_path / "t.csv"
    path.write_text("step_id,admission_blocker,tenant\n0,,\n1,,\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = _read_table_file(path)
    for col in ("admission_blocker", "tenant"):
        assert isinstance(df[col].dtype, pd.CategoricalDtype), col
        assert df[col].tolist() == ["", ""]
    path.write_text("step_id,admission_blocker\n0,kv_cache\n1,\n")
    assert _read_table_file(path)["admission_blocker"].tolist() == ["kv_cache", ""]


def test_parquet_tables_are_written_in_row_groups(tmp_path, monkeypatch):
    """Small row groups (so no whole-table Arrow copy) read back as the tables pandas' own
    one-piece ``to_parquet`` gives."""
    import pyarrow.parquet as pq

    from reports import parquet
    from reports import run_dir as rd
    from reports.columns import ColumnTable
    from reports.tables import build_columns

    columns = build_columns(known_log())
    tables = columns.to_frames()
    monkeypatch.setattr(parquet, "PARQUET_ROW_GROUP_ROWS", 3)
    rd.write_tables(tmp_path, columns, "parquet")
    for name in rd.TABLES:
        df = getattr(tables, name)
        assert pq.ParquetFile(tmp_path / f"{name}.parquet").num_row_groups == -(-len(df) // 3)
        df.to_parquet(tmp_path / "whole.parquet", index=False)
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"),
                                      pd.read_parquet(tmp_path / "whole.parquet"))
    empty = columns.requests.take(np.zeros(0, dtype=np.int64))
    assert isinstance(empty, ColumnTable) and len(empty) == 0
    parquet.write_parquet(tmp_path / "empty.parquet", empty)
    assert list(pd.read_parquet(tmp_path / "empty.parquet").columns) == list(empty)


def test_rebuild_keeps_previous_options_unless_given(run_dir, tmp_path):
    write_run_dir(tmp_path, known_log(), META, plots=False, **OPTS)
    kept = rebuild_report(tmp_path, plots=False)
    assert kept["report_options"]["percentiles"] == [50.0, 99.0]
    assert kept["request_goodput"] == pytest.approx(1 / 6.6) and "p50_e2el_ms" in kept
    changed = rebuild_report(tmp_path, goodput={}, percentiles=[90], plots=False)
    assert changed["request_goodput"] is None and "p90_ttft_ms" in changed
    assert read_json(tmp_path / "summary.json")["report_options"]["percentiles"] == [90.0]


def test_load_errors_are_report_errors(tmp_path):
    with pytest.raises(ReportError, match="does not exist"):
        load_run_dir(tmp_path / "missing")
    with pytest.raises(ReportError, match=r"incomplete: it has no manifest\.json"):
        load_run_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")  # tables and manifest never written
    with pytest.raises(ReportError, match=r"incomplete: it has no manifest\.json"):
        load_run_dir(tmp_path)


def _damage(d, how):
    """Apply one kind of damage to the run directory ``d``."""
    if how == "garbage parquet":
        (d / "requests.parquet").write_bytes(b"not parquet")
    elif how == "table is a directory":
        (d / "steps.parquet").unlink()
        (d / "steps.parquet").mkdir()
    elif how == "dropped column":
        df = pd.read_parquet(d / "token_runs.parquet")
        df.drop(columns=["first_step"]).to_parquet(d / "token_runs.parquet")
    elif how == "text times":
        df = pd.read_parquet(d / "requests.parquet")
        df["arrival_s"] = df["arrival_s"].astype(str)
        df.to_parquet(d / "requests.parquet")
    elif how == "no requests":
        pd.read_parquet(d / "requests.parquet").iloc[:0].to_parquet(d / "requests.parquet")
    elif how in ("run of an unknown request", "negative run", "run past the steps"):
        df = pd.read_parquet(d / "token_runs.parquet")
        col, value = {"run of an unknown request": ("req_index", 10**9),
                      "negative run": ("num_tokens", -3),
                      "run past the steps": ("num_tokens", 10**12)}[how]
        df.loc[0, col] = value
        df.to_parquet(d / "token_runs.parquet")
    elif how == "negative stage time":
        df = pd.read_parquet(d / "requests.parquet")
        df["arrival_s"] = -df["arrival_s"] - 1
        df.to_parquet(d / "requests.parquet")
    elif how == "config.json is a list":
        (d / "config.json").write_text("[1]")
    elif how == "workload is a string":
        meta = read_json(d / "config.json")
        (d / "config.json").write_text(json.dumps({**meta, "workload": "x"}))
    elif how == "summary.json is null":
        (d / "summary.json").write_text("null")


@pytest.mark.parametrize(("how", "match"), [
    ("garbage parquet", "the requests table cannot be read"),
    ("table is a directory", r"steps\.parquet has [\d,]+ bytes, its manifest"),
    ("dropped column", r"the token_runs table lacks column\(s\) first_step"),
    ("text times", r"non-numeric column\(s\) requests.arrival_s"),
    ("no requests", "the requests table has no rows"),
    ("run of an unknown request", "token_runs.req_index outside the requests table"),
    ("negative run", "token_runs need first_step >= 0 and num_tokens >= 1"),
    ("run past the steps", "token_runs refer to steps the steps table does not have"),
    ("negative stage time", "negative or infinite stage times"),
    ("config.json is a list", "must hold a JSON object"),
    ("workload is a string", "'workload' must be an object"),
])
def test_a_damaged_run_directory_is_named_not_a_traceback(run_dir, tmp_path, how, match):
    """Each damage is refused by the manifest first; stamped into a new manifest (a writer
    that wrote bad files consistently), the content checks still name it."""
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(run_dir[0], d)
    _damage(d, how)
    with pytest.raises(ReportError, match=r"manifest|incomplete"):
        rebuild_report(d, plots=False)
    if how != "table is a directory":
        _restamp(d)
        with pytest.raises(ReportError, match=match):
            rebuild_report(d, plots=False)


def _restamp(d):
    """Rewrite ``d``'s manifest for the files as they are now (row counts left out)."""
    from engine.output_dir import MANIFEST_NAME, build_manifest

    old = json.loads((d / MANIFEST_NAME).read_text())
    new = build_manifest(d, "run", data=old["data"], info=old["info"])
    (d / MANIFEST_NAME).write_text(json.dumps(new))


def test_a_damaged_summary_is_rebuilt(run_dir, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(run_dir[0], d)
    before = read_json(d / "summary.json")
    (d / "summary.json").write_text("null")
    after = rebuild_report(d, plots=False)
    assert {k: v for k, v in after.items() if k != "date"} == {
        k: v for k, v in before.items() if k != "date"}


def test_compare_runs(run_dir, tmp_path):
    d, _ = run_dir
    other = tmp_path / "other"
    write_run_dir(other, known_log(), {**META, "label": "copy"}, plots=False)
    out = tmp_path / "cmp"
    result = compare_runs([d, other], out, labels=["A", "B"], percentiles=[50, 99])
    assert {p.name for p in out.iterdir()} == {"compare.json", "compare.md", "compare.html",
                                               "compare_cdfs.png", "manifest.json"}
    rows = pd.DataFrame(result["rows"])
    b = rows[rows["run"] == "B"]
    assert set(b["metric"]) >= {"ttft", "tpot", "itl", "e2el", "request_throughput"}
    assert (b["rel_diff"].dropna() == 0).all()  # the same log twice
    assert set(b["stat"]) >= {"mean", "median", "p99"}
    assert "Δ B vs A" in (out / "compare.md").read_text()
    with pytest.raises(ReportError):
        compare_runs([d], out)
    with pytest.raises(ReportError):
        compare_runs([d, other], out, labels=["only-one"])


def test_rate_sweep_plot(tmp_path):
    summaries = [{"request_rate": r, "median_ttft_ms": 10 * r, "p99_ttft_ms": 20 * r,
                  "median_tpot_ms": 5.0, "median_e2el_ms": 100.0 + r,
                  "request_throughput": min(r, 4.0), "request_goodput": min(r, 3.0)}
                 for r in (1.0, 2.0, 4.0, 8.0)] + [{"request_rate": "inf"}]
    png = plot_rate_sweep(summaries, tmp_path / "sweep.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bin_steps_mean_max_and_gaps():
    steps = pd.DataFrame({"update_time_s": [0.0, 0.1, 0.2, 0.9, 1.0],
                          "kv_usage": [0.1, 0.3, 0.5, 0.9, 0.7]})
    b = bin_steps(steps, ["kv_usage"], max_bins=5)
    assert b.count.tolist() == [2, 1, 0, 0, 2]
    np.testing.assert_allclose(b.mean["kv_usage"][:2], [0.2, 0.5])
    assert math.isnan(b.mean["kv_usage"][2]) and b.max["kv_usage"][4] == 0.9
    assert len(bin_steps(steps.iloc[:0], ["kv_usage"]).time_s) == 0
