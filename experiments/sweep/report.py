"""A sweep from start to finish: experiment → points → records → tidy table, plots, summary.

Output directory::

    DIR/results.parquet, results.csv   one row per point: labels (point, variant, series,
                                       seed, the grid axes), config columns, every metric
    DIR/summary.md                     the seed-averaged table of the headline metrics
    DIR/plots/compare.png              latency and goodput vs request rate (or the swept
                                       number), one line per series (variant + other axes)
    DIR/sweep.json                     the experiment as parsed + each point's cache key
    DIR/cache/<key>.json               one cached record per point (shared across reruns)
    DIR/runs/<key>/                    full run directories, with --save-runs only
    DIR/manifest.json                  written last (engine/output_dir.py)

The directory is written whole: everything but the cache goes into a staging directory that
replaces DIR once the results are complete, so an interrupted sweep leaves the previous
results (or none) and its cache, from which a rerun resumes.

A *series* is what a line in a comparison plot shows: the variant name and the values of the
grid axes other than the x axis and the seed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine.output_dir import OutputDir, atomic_write_text
from experiments.sweep.backends import Backend
from experiments.sweep.expfile import ExperimentSpec, SweepPoint, expand_points
from experiments.sweep.runner import ResultCache, RunStats, cache_key, make_task, run_tasks

RATE_KEY = "workload.request_rate"
#: Headline metrics of summary.md and the printed table (those present are shown).
HEADLINE: tuple[str, ...] = (
    "request_throughput", "request_goodput", "slo_attainment_all", "median_ttft_ms",
    "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "median_e2el_ms",
    "engine_prefix_cache_hit_rate", "engine_num_preemptions",
)


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    """What ``run_experiment`` produced."""

    table: pd.DataFrame  # one row per point
    stats: RunStats
    out_dir: Path
    x: str | None  # the comparison plots' x column
    plots: tuple[Path, ...]


def point_labels(spec: ExperimentSpec, point: SweepPoint, x_key: str | None) -> dict[str, Any]:
    """The label columns of a point's row (``series`` leaves out the x axis and the seed)."""
    labels: dict[str, Any] = {"point": point.index, "variant": point.variant, "seed": point.seed}
    parts = [point.variant] if point.variant else []
    for key, value in point.axis_values:
        labels[f"axis:{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
        if key != x_key:
            parts.append(f"{key.rpartition('.')[2]}={value}")
    labels["series"] = ", ".join(parts) or spec.name
    return labels


def choose_x(spec: ExperimentSpec) -> str | None:
    """The request rate if it varies; else the first all-numeric grid axis; else None."""
    rate_varies = any(k == RATE_KEY for k in spec.axis_keys) or len(
        {dict(v.overrides).get(RATE_KEY) for v in spec.variants}) > 1
    if rate_varies:
        return RATE_KEY
    for key, values in spec.axes:
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return key
    return None


def open_sweep_dir(path: str | Path) -> OutputDir:
    """A sweep's output directory, opened for writing (its cache kept across reruns)."""
    return OutputDir(path, "sweep", keep=("cache",)).open()


def run_experiment(
    spec: ExperimentSpec,
    out_dir: str | Path | OutputDir,
    backend: Backend,
    *,
    resume: bool = True,
    save_runs: bool = False,
    plots: bool = True,
    progress: Callable[[int, int, RunStats], None] | None = None,
    points: list[SweepPoint] | None = None,
) -> SweepOutcome:
    """Validate every point, run those not cached, write the table, summary and plots into
    ``out_dir`` (a path, or a sweep directory already opened by ``open_sweep_dir``);
    ``points``: ``expand_points(spec)``, if the caller has them already."""
    if points is None:
        points = expand_points(spec)  # raises with every invalid point listed
    out = out_dir if isinstance(out_dir, OutputDir) else open_sweep_dir(out_dir)
    with out:
        outcome = _run(spec, points, out, backend, resume, save_runs, plots, progress)
        out.commit(data=["results.parquet", "results.csv", "sweep.json"])
    return outcome


def _run(spec: ExperimentSpec, points: list[SweepPoint], out_dir: OutputDir,
         backend: Backend, resume: bool, save_runs: bool, plots: bool,
         progress: Callable[[int, int, RunStats], None] | None) -> SweepOutcome:
    from reports.meta import write_json

    out = out_dir.staging
    tasks = []
    for p in points:
        task = make_task(p.config, spec.report)
        if save_runs:
            task["run_dir"] = str(out / "runs" / cache_key(task))
        tasks.append(task)
    records, stats = run_tasks(tasks, backend, ResultCache(out_dir.live("cache")),
                               resume=resume, progress=progress)
    if save_runs:
        _keep_saved_runs(out_dir, records)
    x_key = choose_x(spec)
    rows = [{**point_labels(spec, p, x_key), **r} for p, r in zip(points, records, strict=True)]
    table = pd.DataFrame(rows)
    table.to_parquet(out / "results.parquet", index=False)
    table.to_csv(out / "results.csv", index=False)
    write_json(out / "sweep.json", {
        "name": spec.name, "description": spec.description, "base": spec.base,
        "axes": [[k, list(v)] for k, v in spec.axes],
        "variants": [{"name": v.name, "overrides": dict(v.overrides)} for v in spec.variants],
        "seeds": list(spec.seeds), "report": spec.report,
        "points": [{"point": p.index, "variant": p.variant, "seed": p.seed,
                    "axes": dict(p.axis_values), "cache_key": r["cache_key"]}
                   for p, r in zip(points, records, strict=True)],
    })
    x_col = _x_column(x_key)
    summary = aggregate(table, x_col)
    atomic_write_text(out / "summary.md", _summary_md(spec, summary, stats))
    pngs: list[Path] = []
    if plots and not ok_rows(table).empty:
        pngs = _plots(spec, table, x_col, out / "plots")
    final = out_dir.path
    return SweepOutcome(table, stats, final, x_col,
                        tuple(final / p.relative_to(out) for p in pngs))


def _keep_saved_runs(out: OutputDir, records: list[dict[str, Any]]) -> None:
    """With --save-runs, the run directories of cached points come from the previous
    results (hard links: nothing is copied)."""
    for record in records:
        old = out.path / "runs" / record["cache_key"]
        new = out.staging / "runs" / record["cache_key"]
        if old.is_dir() and not new.exists():
            shutil.copytree(old, new, copy_function=_link_or_copy)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _x_column(x_key: str | None) -> str | None:
    """The table column for the x axis: the summary's offered ``request_rate`` for rates."""
    if x_key is None:
        return None
    return "request_rate" if x_key == RATE_KEY else x_key


def ok_rows(table: pd.DataFrame) -> pd.DataFrame:
    if "error" in table:
        return table[table["error"].isna()]
    return table


def aggregate(table: pd.DataFrame, x_col: str | None) -> pd.DataFrame:
    """Seed means of the headline metrics per (series, x), in point order."""
    ok = ok_rows(table)
    metrics = [m for m in HEADLINE if m in ok and ok[m].notna().any()]
    metrics += sorted(c for c in ok if re.fullmatch(r"prio-?\d+_(p99_ttft_ms|slo_attainment_all)",
                                                    str(c)))
    keys = ["series"] + ([x_col] if x_col else [])
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "seeds", *metrics])
    grouped = ok.groupby(keys, sort=False, dropna=False)
    agg = grouped[metrics].mean(numeric_only=True)
    agg.insert(0, "seeds", grouped.size())
    return agg.reset_index()


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub Markdown table (numbers to ``digits`` significant figures)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "–"
            if math.isinf(v):
                return "inf"
            return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:,.0f}"
        return str(v)

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _summary_md(spec: ExperimentSpec, summary: pd.DataFrame, stats: RunStats) -> str:
    head = f"# {spec.name}\n\n" + (f"{spec.description}\n\n" if spec.description else "")
    ran = (f"{stats.num_run} point(s) run, {stats.num_cached} from the cache"
           + (f", {stats.num_failed} failed" if stats.num_failed else ""))
    if stats.num_run and stats.run_wall_s > 0:
        ran += (f"; {stats.sims_per_minute:.1f} simulations/min on {stats.workers} worker(s)")
    return head + f"{ran}. Means over seeds:\n\n" + markdown_table(summary)


def _plots(spec: ExperimentSpec, table: pd.DataFrame, x_col: str | None, d: Path) -> list[Path]:
    from experiments.sweep.plots import plot_comparison

    return [plot_comparison(ok_rows(table), x_col, d / "compare.png", title=spec.name)]
