"""The tables as numpy columns: the same DataFrames, the same Parquet bytes as pandas' own
route, the same summary — and no pandas on the way from a log to a run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from engine.core.events import EventKind, EventLog
from reports import parquet
from reports.columns import (
    ColumnTable,
    Labels,
    OptionalInts,
    RunTables,
    as_columns,
    frame_columns,
    to_frame,
)
from reports.metrics import summarize
from reports.run_dir import rebuild_report, write_run_dir
from reports.tables import build_columns, build_tables
from sim.config import SimConfig
from sim.runtime import run_simulation
from tests.reports.logs import known_log

ROOT = Path(__file__).resolve().parents[2]

#: Small runs whose tables have every kind of column: replicas, labels, rejections.
RUNS: dict[str, dict[str, Any]] = {
    "dp 3, rejections": {
        "num_gpu_blocks": 600, "max_model_len": 1500, "data_parallel_size": 3,
        "router": "round_robin",
        "workload": {"dataset_name": "random", "num_prompts": 150, "request_rate": 40,
                     "random_input_len": 900, "random_output_len": 60,
                     "random_range_ratio": 0.6, "seed": 4},
    },
    "tenants and SLO classes": {
        "workload": {"num_prompts": 120, "request_rate": 30,
                     "tenant_mix": [["a", 0.3], ["b", 0.7]],
                     "slo_classes": [["chat", 500, 50], ["batch", 10000, 200]],
                     "slo_class_mix": [["chat", 0.5], ["batch", 0.5]]},
    },
}


def _odd_table(num_rows: int) -> ColumnTable:
    """Every kind of column, with missing values and categories no row has."""
    rng = np.random.default_rng(num_rows)
    ints = rng.integers(0, 5, num_rows)
    floats = rng.random(num_rows)
    floats[ints == 0] = np.nan
    text = np.empty(num_rows, dtype=object)
    text[:] = [f"r{i}" for i in range(num_rows)]
    return ColumnTable({
        "req_index": np.arange(num_rows, dtype=np.int64), "req_id": text,
        "success": ints > 1, "small": ints.astype(np.int32), "time_s": floats,
        "reason": Labels(np.where(ints == 1, -1, ints % 3), ("stop", "length", "abort"),
                         "object"),
        "none_yet": Labels(np.full(num_rows, -1), (), "object"),
        "blocker": Labels.sorted_from([["", "kv_cache"][i % 2] for i in ints.tolist()]),
        "no_blocker": Labels(np.full(num_rows, -1), ()),
        "replica": OptionalInts(np.where(ints == 3, np.nan, ints % 2)),
    })


def _tables(name: str) -> Any:
    if name == "known log":
        return build_columns(known_log())
    return build_columns(run_simulation(SimConfig.from_dict(RUNS[name])).event_log)


@pytest.mark.parametrize("rows_per_group", [3, parquet.PARQUET_ROW_GROUP_ROWS])
@pytest.mark.parametrize("name", ["known log", *RUNS])
def test_parquet_files_are_pandas_own_byte_for_byte(tmp_path, monkeypatch, name: str,
                                                    rows_per_group: int) -> None:
    monkeypatch.setattr(parquet, "PARQUET_ROW_GROUP_ROWS", rows_per_group)
    columns = _tables(name)
    tables = [(n, getattr(columns, n)) for n in ("requests", "steps", "token_runs")]
    tables += [("odd", _odd_table(20)), ("odd, empty", _odd_table(0))]
    for table_name, table in tables:
        ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
        parquet.write_parquet(ours, table)
        parquet.write_frame_parquet(theirs, to_frame(table))  # pyarrow's pandas conversion
        assert ours.read_bytes() == theirs.read_bytes(), table_name
        pd.testing.assert_frame_equal(pd.read_parquet(ours), pd.read_parquet(theirs))


@pytest.mark.parametrize("name", ["known log", *RUNS])
def test_frames_and_columns_convert_both_ways_and_summarise_alike(name: str) -> None:
    columns = _tables(name)
    frames = columns.to_frames()
    again = as_columns(frames).to_frames()
    for table in ("requests", "steps", "token_runs"):
        pd.testing.assert_frame_equal(getattr(again, table), getattr(frames, table),
                                      check_exact=True)
    meta = {"date": "20261202-120000",  # fixed: a summary dates itself when its meta has none
            "config": {"workload": {"slo_classes": [["chat", 500, 50], ["batch", 10000, 200]]}}}
    for options in ({}, {"goodput": {"ttft": 200.0}, "detailed": True}):
        assert summarize(columns, meta, **options) == summarize(frames, meta, **options)


def test_frames_of_nullable_dtypes_summarise_alike(tmp_path) -> None:
    """Tables read with pandas' nullable dtypes (Int64 indices, Float64, boolean) give the
    summary the default dtypes give."""
    frames = _tables("dp 3, rejections").to_frames()
    nullable = []
    for name in ("requests", "steps", "token_runs"):
        parquet.write_frame_parquet(tmp_path / f"{name}.parquet", getattr(frames, name))
        nullable.append(pd.read_parquet(tmp_path / f"{name}.parquet",
                                        dtype_backend="numpy_nullable"))
    assert str(nullable[2]["req_index"].dtype) == "Int64"
    meta = {"date": "20261202-120000"}  # fixed: both summaries must not straddle a second
    assert summarize(RunTables(*nullable), meta) == summarize(frames, meta)


def test_a_run_without_finished_requests_rebuilds_its_detailed_summary(tmp_path) -> None:
    """Its reasons are all missing (read back from Parquet as objects of None): the rebuilt
    summary, errors included, is the one written at the end of the run."""
    log = EventLog()
    for i, req_id in enumerate(("a", "b")):
        log.record(req_id, EventKind.ARRIVAL, float(i), 10)
        log.record(req_id, EventKind.SCHEDULED, i + 0.5, 0)
    written = write_run_dir(tmp_path, log, {}, plots=False, detailed=True)
    rebuilt = rebuild_report(tmp_path, plots=False)
    assert written["errors"] == ["nan", "nan"]
    same = [json.dumps({**summary, "date": None}, sort_keys=True, default=str)
            for summary in (rebuilt, written)]  # as JSON: NaN throughputs compare equal
    assert same[0] == same[1]


def test_a_run_of_the_known_log_builds_the_frames_it_always_built() -> None:
    """``build_tables`` is ``build_columns`` converted: the dtypes pandas users rely on."""
    req = build_tables(known_log()).requests
    assert str(req["req_id"].dtype) == "str" and req["success"].dtype == bool
    assert isinstance(req["finish_reason"].dtype, pd.CategoricalDtype)
    assert req["finish_reason"].cat.categories.dtype == object


def test_labels_read_text_as_pandas_does() -> None:
    labels = Labels(np.array([2, -1, 0, 2, 1]), ("x", "y", "z"))
    assert labels.codes.dtype == np.int8
    assert labels.strings().tolist() == ["z", "", "x", "z", "y"]
    assert labels.strings(missing=None).tolist() == ["z", None, "x", "z", "y"]
    assert labels.counts().tolist() == [1, 1, 2]
    assert labels.first_appearance().tolist() == [2, 0, 1]
    assert labels.code_of("y") == 1 and labels.code_of("w") == -2
    present = OptionalInts(np.array([1.0, 0.0]))
    assert present.numbers().dtype == np.int64
    assert np.isnan(OptionalInts(np.array([1.0, np.nan])).numbers()[1])
    objects = frame_columns(pd.DataFrame({"r": [None, "b", "a", "b"]})).labels("r")
    assert objects.categories == ("b", "a") and objects.codes.tolist() == [-1, 0, 1, 0]


def test_tables_refuse_columns_of_different_lengths_and_misread_kinds() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        ColumnTable({"a": np.zeros(2), "b": np.zeros(3)})
    table = _odd_table(4)
    with pytest.raises(TypeError, match="labels"):
        table.array("reason")
    with pytest.raises(TypeError, match="not text"):
        table.labels("time_s")


def test_writing_a_run_directory_does_not_import_pandas(tmp_path) -> None:
    """What a report process imports, and all it runs to write a run directory without plots,
    leaves pandas unimported (importing it costs more CPU than summarising the run)."""
    code = (
        "import sys\n"
        "from reports.run_dir import write_run_dir\n"
        "import reports.render, reports.report_process\n"
        "from tests.reports.logs import known_log\n"
        f"write_run_dir({str(tmp_path / 'run')!r}, known_log(), {{}}, plots=False)\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert (tmp_path / "run" / "summary.json").exists()
