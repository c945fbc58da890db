"""A run directory: everything one run produced, and the report rebuilt from it (METRICS.md §4).

Layout::

    RUN_DIR/config.json             meta: config, seed, version, git commit, kind, stats (meta.py)
    RUN_DIR/requests.parquet|csv    one row per request (tables.build_requests)
    RUN_DIR/steps.parquet|csv       one row per engine step (+ delivered_time_s)
    RUN_DIR/token_runs.parquet|csv  one row per token run
    RUN_DIR/summary.json            vllm-bench-compatible summary + our sections (metrics.py)
    RUN_DIR/report.md, report.html  the report (render.py); the HTML embeds the plots
    RUN_DIR/plots/*.png             the plots (plots.py), unless plots=False
    RUN_DIR/manifest.json           written last: every file's size and SHA-256, each table's
                                    row count, the report options (engine/output_dir.py)

A run directory is written whole or not at all (``engine.output_dir.OutputDir``: a staging
directory beside it, renamed into place once complete), so an interrupted run leaves the
previous directory or nothing. ``load_run_dir`` refuses a directory whose config or tables
differ from its manifest (cut short, replaced, mixed with another run's files) in one line
naming the file. The tables hold everything the summary is computed from, so
``rebuild_report`` reproduces ``summary.json`` from the files alone (the round trip is tested)
even when the old summary is damaged. Parquet is the default: CSV writing of ~300k steps is far
slower than the simulator that produced them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from engine.core.errors import UserError
from engine.core.events import STEP_COLUMNS, EventLog
from engine.output_dir import OutputDir, read_manifest, verify_files
from engine.paths import input_dir
from reports.columns import RunColumns, as_frames
from reports.errors import ReportError
from reports.meta import RunMeta, meta_dict, read_json, token_budget, write_json
from reports.metrics import summarize
from reports.parquet import write_frame_parquet, write_parquet
from reports.stats import DEFAULT_PERCENTILE_METRICS, DEFAULT_PERCENTILES
from reports.tables import STAGE_COLUMNS, RunTables, build_columns
from reports.written import WrittenRun, commit_run

if TYPE_CHECKING:
    import pandas as pd

TABLES: tuple[str, ...] = ("requests", "steps", "token_runs")
FileFormat = Literal["parquet", "csv"]


def write_tables(out_dir: str | Path, tables: RunTables | RunColumns, file_format: FileFormat
                 ) -> dict[str, int]:
    """The three tables into ``out_dir``; {file name: row count}. Columns are written to
    Parquet without pandas (``reports.parquet.write_parquet``: the bytes pandas would write),
    DataFrames through pyarrow's pandas conversion, and both to CSV as DataFrames."""
    if file_format not in ("parquet", "csv"):
        raise ReportError(f"unknown file format {file_format!r}: use parquet or csv")
    d = Path(out_dir)
    rows = {f"{name}.{file_format}": len(getattr(tables, name)) for name in TABLES}
    if isinstance(tables, RunColumns) and file_format == "parquet":
        for name in TABLES:
            write_parquet(d / f"{name}.parquet", getattr(tables, name))
        return rows
    frames = as_frames(tables)
    for name in TABLES:
        df = getattr(frames, name)
        if file_format == "parquet":
            write_frame_parquet(d / f"{name}.parquet", df)  # a DataFrame's own dtypes
        else:
            df.to_csv(d / f"{name}.csv", index=False)
    return rows


def _read_table(d: Path, file_name: str) -> pd.DataFrame:
    """One table of a run directory, refused by name if it cannot be read or lacks the
    columns this version writes (a damaged or foreign file is a ``ReportError``)."""
    name = file_name.partition(".")[0]
    try:
        df = _read_table_file(d / file_name)
    except ReportError:
        raise
    except Exception as exc:  # pyarrow, pandas, OS and decoding errors of a damaged file
        raise ReportError(
            f"{d}: the {name} table cannot be read ({type(exc).__name__}: {exc})"
        ) from None
    missing = [c for c in REQUIRED_COLUMNS[name] if c not in df]
    if missing:
        raise ReportError(f"{d}: the {name} table lacks column(s) {', '.join(missing)}")
    return df


#: Columns every run directory's tables have (what ``reports.tables`` builds and reads).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "requests": (
        "req_index", "req_id", "success", "finish_reason", "num_prompt_tokens",
        "num_output_tokens", "arrival_s", "first_token_delivered_s", "last_token_delivered_s",
    ),
    "steps": ("step_id", *STEP_COLUMNS[1:], "delivered_time_s"),
    "token_runs": ("req_index", "first_step", "num_tokens"),
}
#: Columns that hold text or flags, not numbers.
TEXT_COLUMNS: frozenset[str] = frozenset(
    {"req_id", "finish_reason", "rejected_reason", "admission_blocker", "success", "tenant",
     "slo_class"}
)


def _is_count(column: str) -> bool:
    """Whether a table column holds integers (indices and counts; the writer's dtypes):
    an empty CSV table must index with them as a Parquet one does."""
    return (column.startswith("num_") or column in ("req_index", "step_id", "first_step",
                                                    "decode_context_sum", "prefix_hit_tokens"))


def _read_table_file(path: Path) -> pd.DataFrame:
    import pandas as pd

    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    df = pd.read_csv(path, dtype={"req_id": str, "tenant": str, "slo_class": str})
    if df.empty:  # a header alone: numbers have no values to infer their type from
        for col in df.columns:
            if col not in TEXT_COLUMNS:
                df[col] = df[col].astype(np.int64 if _is_count(col) else np.float64)
    for col in ("admission_blocker", "tenant", "slo_class"):  # "" (read back as NaN): none
        if col in df:
            df[col] = _labels(df[col])
    for col in ("finish_reason", "rejected_reason"):
        if col in df:
            df[col] = pd.Categorical(df[col].astype(object))
    if "success" in df:
        df["success"] = df["success"].astype(bool)
    return df


def _labels(column: pd.Series) -> pd.Categorical:
    """A text column read from CSV as categories, "" where it was empty. A column empty
    throughout reads back as float NaN: made text first (filling a float column with "" is
    deprecated in pandas)."""
    import pandas as pd

    text = column.astype(object)
    return pd.Categorical(text.where(text.notna(), "").astype(str))


def _table_files(d: Path, manifest: Mapping[str, Any]) -> list[str]:
    """The table files the manifest lists, one per table; a table file of this run's names
    that the manifest does not list (another run's, another format's) refuses the run."""
    listed = manifest["files"]
    names = []
    for name in TABLES:
        mine = [f"{name}.{ext}" for ext in ("parquet", "csv") if f"{name}.{ext}" in listed]
        if len(mine) != 1:
            raise ReportError(f"{d}: its manifest lists no single {name} table (damaged)")
        names.append(mine[0])
        for ext in ("parquet", "csv"):
            other = f"{name}.{ext}"
            if other not in listed and (d / other).exists():
                raise ReportError(
                    f"{d}: {other} is not part of this run (its manifest lists {mine[0]}): "
                    "files of another run were added; remove it or write the run again"
                )
    return names


def load_run_dir(run_dir: str | Path) -> tuple[dict[str, Any], RunTables]:
    """``(meta, tables)`` of a run directory written by ``write_run_dir``, verified against
    its manifest first (see the module docstring)."""
    meta, tables, _ = load_run_dir_verified(run_dir)
    return meta, tables


def load_run_dir_verified(run_dir: str | Path
                          ) -> tuple[dict[str, Any], RunTables, dict[str, Any]]:
    """``load_run_dir`` that also returns the run's manifest."""
    try:
        d = input_dir(run_dir, "run directory")
        manifest = read_manifest(d, "run", "run directory")
        table_files = _table_files(d, manifest)
        verify_files(d, manifest, ["config.json", *table_files], "run directory")
    except UserError as exc:  # a path or manifest problem: a report error like the others
        raise ReportError(str(exc)) from None
    config = d / "config.json"
    meta = read_json_object(config)
    for key in ("config", "stats", "workload", "engine_config", "reject_reasons"):
        if not isinstance(meta.get(key) or {}, dict):
            raise ReportError(f"{config}: {key!r} must be an object, got {meta[key]!r:.60}")
    for key, value in meta.get("config", {}).items():
        if key in ("engine", "frontend", "workload", "roofline", "scheduler", "cache") and not (
            value is None or isinstance(value, dict)
        ):
            raise ReportError(f"{config}: config.{key} must be an object, got {value!r:.60}")
    tables = RunTables(*(_read_table(d, f) for f in table_files))
    for f, df in zip(table_files, (tables.requests, tables.steps, tables.token_runs),
                     strict=True):
        expected = manifest["files"][f].get("rows")
        if expected is not None and len(df) != expected:
            raise ReportError(f"{d}: {f} has {len(df):,} rows, its manifest {expected:,}")
    check_tables(d, tables)
    return meta, tables, manifest


def read_json_object(path: Path) -> dict[str, Any]:
    """A run directory's JSON file, which must hold an object."""
    try:
        value = read_json(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ReportError(f"{path} cannot be read as JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):
        raise ReportError(f"{path} must hold a JSON object, got {value!r:.60}")
    return value


def check_tables(d: Path, tables: RunTables) -> None:
    """The cross-table facts every report relies on: requests numbered 0..n-1, token runs of
    known requests and steps, numeric times; a table that breaks them is refused."""
    import pandas as pd

    req, steps, runs = tables.requests, tables.steps, tables.token_runs
    n = len(req)
    if n == 0:
        raise ReportError(f"{d}: the requests table has no rows")
    bad_cols = [
        f"{name}.{c}" for name, df in (("requests", req), ("steps", steps), ("token_runs", runs))
        for c in REQUIRED_COLUMNS[name]
        if c not in ("req_id", "finish_reason", "admission_blocker", "success")
        and not pd.api.types.is_numeric_dtype(df[c])
    ]
    if bad_cols:
        raise ReportError(f"{d}: non-numeric column(s) {', '.join(bad_cols)}")
    if not (req["req_index"].to_numpy() == np.arange(n)).all():
        raise ReportError(f"{d}: requests.req_index must number the rows 0..{n - 1}")
    ids = steps["step_id"].to_numpy()
    if len(ids) and (ids.min() < 0 or len(np.unique(ids)) != len(ids)):
        raise ReportError(f"{d}: steps.step_id must be distinct and >= 0")
    if len(runs):
        r, first, count = (runs[c].to_numpy() for c in ("req_index", "first_step", "num_tokens"))
        if (r < 0).any() or (r >= n).any():
            raise ReportError(f"{d}: token_runs.req_index outside the requests table")
        if (count < 1).any() or (first < 0).any():
            raise ReportError(f"{d}: token_runs need first_step >= 0 and num_tokens >= 1")
        last = first + count - 1
        if not (np.isin(first, ids).all() and np.isin(last, ids).all()):
            raise ReportError(f"{d}: token_runs refer to steps the steps table does not have")
    stage = [c for c in STAGE_COLUMNS if c in req]  # absolute times: NaN (never reached) or >= 0
    values = req[stage].to_numpy(dtype=np.float64)
    if np.isinf(values).any() or (values < 0).any():
        raise ReportError(f"{d}: the requests table holds negative or infinite stage times")


def report_options_dict(goodput: Mapping[str, float] | None, percentiles: Sequence[float],
                        percentile_metrics: Sequence[str], detailed: bool) -> dict[str, Any]:
    """The options a summary was computed with, as stored in the run's manifest (``report``
    keeps them when it rebuilds the summary)."""
    return {"goodput": dict(goodput) if goodput else None,
            "percentiles": [float(p) for p in percentiles],
            "percentile_metrics": list(percentile_metrics), "detailed": bool(detailed)}


def write_report_files(
    out_dir: str | Path,
    tables: RunTables | RunColumns,
    meta: Mapping[str, Any],
    *,
    goodput: Mapping[str, float] | None,
    percentiles: Sequence[float],
    percentile_metrics: Sequence[str],
    plots: bool,
    detailed: bool = False,
) -> dict[str, Any]:
    """summary.json, plots/*.png and report.md/.html from tables; returns the summary."""
    from reports.render import write_report

    d = Path(out_dir)
    summary = summarize(
        tables, meta, goodput=goodput, percentiles=percentiles,
        percentile_metrics=percentile_metrics, detailed=detailed,
    )
    write_json(d / "summary.json", summary)
    pngs: dict[str, Path] = {}
    if plots:
        from reports.plots import plot_run

        pngs = plot_run(as_frames(tables), summary, d / "plots", token_budget(meta))
    write_report(d, summary, meta, pngs)
    return summary


def write_run_files(
    out_dir: str | Path,
    tables: RunTables | RunColumns,
    meta: RunMeta | Mapping[str, Any],
    *,
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    percentile_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
    plots: bool = True,
    file_format: FileFormat = "parquet",
    detailed: bool = False,
) -> WrittenRun:
    """Every file of a run directory into ``out_dir`` (an ``OutputDir``'s staging directory;
    ``commit_run`` then publishes it)."""
    if file_format not in ("parquet", "csv"):
        raise ReportError(f"unknown file format {file_format!r}: use parquet or csv")
    d = Path(out_dir)
    meta = meta_dict(meta)
    meta.setdefault("date", datetime.now().strftime("%Y%m%d-%H%M%S"))
    write_json(d / "config.json", meta)
    rows = write_tables(d, tables, file_format)
    summary = write_report_files(
        d, tables, read_json(d / "config.json"), goodput=goodput, percentiles=percentiles,
        percentile_metrics=percentile_metrics, plots=plots, detailed=detailed,
    )
    options = report_options_dict(goodput, percentiles, percentile_metrics, detailed)
    return WrittenRun(summary, rows, ("config.json", *rows), options)


def open_run_dir(path: str | Path, what: str = "--out") -> OutputDir:
    """A run directory about to be written: locked, its location checked, staging ready."""
    return OutputDir(path, "run", what=what).open()


def write_run_dir(
    out_dir: str | Path,
    log: EventLog,
    meta: RunMeta | Mapping[str, Any],
    *,
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    percentile_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
    plots: bool = True,
    file_format: FileFormat = "parquet",
    detailed: bool = False,
) -> dict[str, Any]:
    """Write a complete run directory for ``log`` (see the module docstring); the summary."""
    return write_run_dir_from_tables(
        out_dir, build_columns(log), meta, goodput=goodput, percentiles=percentiles,
        percentile_metrics=percentile_metrics, plots=plots, file_format=file_format,
        detailed=detailed,
    )


def write_run_dir_from_tables(
    out_dir: str | Path,
    tables: RunTables | RunColumns,
    meta: RunMeta | Mapping[str, Any],
    *,
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    percentile_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
    plots: bool = True,
    file_format: FileFormat = "parquet",
    detailed: bool = False,
) -> dict[str, Any]:
    """``write_run_dir`` for tables already built (the caller may drop the event log first:
    a million-request log and its tables need not be in memory together)."""
    with open_run_dir(out_dir, "run directory") as out:
        written = write_run_files(
            out.staging, tables, meta, goodput=goodput, percentiles=percentiles,
            percentile_metrics=percentile_metrics, plots=plots, file_format=file_format,
            detailed=detailed,
        )
        commit_run(out, written)
    return written.summary


def _previous_options(d: Path, manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """The report options the run was last reported with: the manifest's, else those of a
    readable summary.json, else none (vllm bench's defaults)."""
    stored = manifest.get("info", {}).get("report_options")
    if isinstance(stored, dict):
        return stored
    try:
        previous = read_json_object(d / "summary.json").get("report_options")
    except ReportError:
        return {}
    return previous if isinstance(previous, dict) else {}


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def rebuild_report(
    run_dir: str | Path,
    *,
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] | None = None,
    percentile_metrics: Sequence[str] | None = None,
    plots: bool = True,
    detailed: bool | None = None,
) -> dict[str, Any]:
    """Recompute summary.json, plots and report from the run directory's data files.

    Options left None keep the values the run was last reported with (stored in its
    manifest), else vllm bench's defaults. The directory is replaced as a whole, like a
    rerun: the old summary, report and plots are kept until the new ones are complete, and
    none survives beside them (``plots=False`` leaves no plots).
    """
    d = input_dir(run_dir, "run directory")
    read_manifest(d, "run", "run directory")  # a run directory at all? (before locking it)
    with OutputDir(d, "run", what="run directory").open() as out:
        meta, tables, manifest = load_run_dir_verified(d)
        previous = _previous_options(d, manifest)
        data = ["config.json", *_table_files(d, manifest)]
        for name in data:
            _link_or_copy(d / name, out.staging / name)
        options = report_options_dict(
            previous.get("goodput") if goodput is None else goodput,
            previous.get("percentiles", DEFAULT_PERCENTILES)
            if percentiles is None else percentiles,
            previous.get("percentile_metrics", DEFAULT_PERCENTILE_METRICS)
            if percentile_metrics is None else percentile_metrics,
            bool(previous.get("detailed", False)) if detailed is None else detailed,
        )
        summary = write_report_files(
            out.staging, tables, meta, goodput=options["goodput"],
            percentiles=options["percentiles"], percentile_metrics=options["percentile_metrics"],
            plots=plots, detailed=options["detailed"],
        )
        rows = {name: manifest["files"][name]["rows"] for name in data[1:]
                if "rows" in manifest["files"][name]}
        out.commit(rows=rows, data=data, info={"report_options": options})
    return summary
