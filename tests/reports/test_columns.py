"""The tables as numpy columns: the same DataFrames, the same Parquet bytes as pandas' own
route, the same summary — and no pandas on the way from a log to a run directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reports import parquet
from reports.columns import ColumnTable, Labels, OptionalInts, as_columns, frame_columns, to_frame
from reports.metrics import summarize
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


def _pandas_route(path: Path, df: pd.DataFrame, rows_per_group: int) -> None:
    """The writer this module replaced: pyarrow's pandas conversion, slice by slice."""
    first = pa.Table.from_pandas(df.iloc[:rows_per_group], preserve_index=False)
    dictionary = [str(c) for c, t in df.dtypes.items() if isinstance(t, pd.CategoricalDtype)]
    with pq.ParquetWriter(path, first.schema, use_dictionary=dictionary) as writer:
        writer.write_table(first)
        for start in range(rows_per_group, len(df), rows_per_group):
            part = df.iloc[start:start + rows_per_group]
            writer.write_table(pa.Table.from_pandas(part, schema=writer.schema,
                                                    preserve_index=False))


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
        _pandas_route(theirs, to_frame(table), rows_per_group)
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
    meta = {"config": {"workload": {"slo_classes": [["chat", 500, 50], ["batch", 10000, 200]]}}}
    for options in ({}, {"goodput": {"ttft": 200.0}, "detailed": True}):
        assert summarize(columns, meta, **options) == summarize(frames, meta, **options)


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
