"""Comparison of two or more runs: A/B of configs, or simulated vs measured (METRICS.md §4).

Every run is recomputed from its directory with the same options (all four latency metrics,
the same percentiles), so the numbers compare like for like. The first run is the baseline:
each other run's value gets ``rel_diff = (value − baseline) / baseline``. Put the measured run
first to read ``rel_diff`` as the simulator's relative error.

Writes ``compare.json`` (long, DataFrame-ready rows), ``compare.md``, a self-contained
``compare.html`` and ``compare_cdfs.png`` (the runs' CDFs overlaid).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.output_dir import OutputDir, atomic_write_text
from reports.errors import ReportError
from reports.meta import write_json
from reports.metrics import summarize
from reports.render import Block, to_html, to_markdown
from reports.run_dir import load_run_dir
from reports.stats import METRIC_TITLES, PERCENTILE_METRICS, percentile_word

DEFAULT_COMPARE_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
#: throughput-like keys compared besides the latency statistics
SCALAR_KEYS: tuple[tuple[str, str], ...] = (
    ("duration", "s"), ("completed", "requests"), ("request_throughput", "req/s"),
    ("output_throughput", "tok/s"), ("total_token_throughput", "tok/s"),
    ("request_goodput", "req/s"),
)


def _labels(run_dirs: Sequence[Path], metas: Sequence[Mapping[str, Any]],
            labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(run_dirs):
            raise ReportError(
                f"got {len(labels)} labels for {len(run_dirs)} runs: give one label per run"
            )
        repeated = sorted({lab for lab in labels if list(labels).count(lab) > 1})
        if repeated or not all(labels):
            raise ReportError(
                f"labels must be distinct and non-empty (one per run), got {','.join(labels)}"
            )
        return list(labels)
    names = [str(m.get("label") or d.name) for m, d in zip(metas, run_dirs, strict=True)]
    return names if len(set(names)) == len(names) else [str(d) for d in run_dirs]


def _rel(value: Any, base: Any) -> float | None:
    if not isinstance(value, (int, float)) or not isinstance(base, (int, float)):
        return None
    if base == 0 or math.isnan(base) or math.isnan(value):
        return None
    return (value - base) / base


def comparison_rows(
    summaries: Sequence[Mapping[str, Any]], labels: Sequence[str], percentiles: Sequence[float]
) -> list[dict[str, Any]]:
    """Long rows: metric, stat, key, unit, run, value, rel_diff (vs the first run)."""
    keys: list[tuple[str, str, str, str]] = []
    for metric in PERCENTILE_METRICS:
        stats = ["mean", "median"] + [f"p{percentile_word(p)}" for p in percentiles if p != 50]
        keys += [(metric, s, f"{s}_{metric}_ms", "ms") for s in stats]
    keys += [(key, "value", key, unit) for key, unit in SCALAR_KEYS]
    rows = []
    base = summaries[0]
    for metric, stat, key, unit in keys:
        for label, s in zip(labels, summaries, strict=True):
            rows.append({
                "metric": metric, "stat": stat, "key": key, "unit": unit, "run": label,
                "value": s.get(key), "rel_diff": _rel(s.get(key), base.get(key)),
            })
    return rows


def _table(rows: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> Block:
    header = ["metric", "stat"] + [f"{lab}" for lab in labels]
    header += [f"Δ {lab} vs {labels[0]}" for lab in labels[1:]]
    by_key: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(r["key"], {})[r["run"]] = r
    cells = []
    for runs in by_key.values():
        first = next(iter(runs.values()))
        name = METRIC_TITLES.get(first["metric"], (first["metric"], ""))[0]
        line = [f"{name} ({first['unit']})", first["stat"]]
        line += [_fmt(runs[lab]["value"]) for lab in labels]
        line += [_pct(runs[lab]["rel_diff"]) for lab in labels[1:]]
        cells.append(line)
    return Block("table", header=header, rows=cells)


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{v:,.2f}" if isinstance(v, float) else str(v)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:+.1f}%"


def compare_runs(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    labels: Sequence[str] | None = None,
    *,
    percentiles: Sequence[float] = DEFAULT_COMPARE_PERCENTILES,
    goodput: Mapping[str, float] | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Compare runs (the first is the baseline); writes compare.{json,md,html} and the CDFs
    into ``out_dir``, a directory written whole (``engine.output_dir.OutputDir``)."""
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) < 2:
        raise ReportError("compare needs at least two run directories")
    with OutputDir(out_dir, "compare").open() as out:
        result = _compare(dirs, out.staging, labels, percentiles, goodput, plots)
        out.commit(data=["compare.json"])
    return result


def _compare(dirs: Sequence[Path], out: Path, labels: Sequence[str] | None,
             percentiles: Sequence[float], goodput: Mapping[str, float] | None,
             plots: bool) -> dict[str, Any]:
    from reports.plots import latency_curves, plot_overlaid_cdfs

    loaded = [load_run_dir(d) for d in dirs]
    names = _labels(dirs, [m for m, _ in loaded], labels)
    summaries = [
        summarize(t, m, goodput=goodput, percentiles=percentiles,
                  percentile_metrics=PERCENTILE_METRICS)
        for m, t in loaded
    ]
    rows = comparison_rows(summaries, names, percentiles)
    blocks = [
        Block("h1", f"twinserve comparison: {', '.join(names)}"),
        Block("p", f"Baseline: {names[0]}. Δ = (run − baseline) / baseline; with the measured "
                   "run as the baseline, Δ is the simulator's relative error."),
        Block("table", header=["run", "directory", "kind", "diagnosis"],
              rows=[[n, str(d), str(s.get("kind")), s["diagnosis"]["verdict"]]
                    for n, d, s in zip(names, dirs, summaries, strict=True)]),
        Block("h2", "Relative differences per metric and percentile"),
        _table(rows, names),
    ]
    if plots:
        png = plot_overlaid_cdfs(
            {n: latency_curves(t) for n, (_, t) in zip(names, loaded, strict=True)},
            out / "compare_cdfs.png",
        )
        blocks += [Block("h2", "Latency CDFs, overlaid"),
                   Block("img", "TTFT, TPOT, ITL and E2EL CDFs of every run", path=png)]
    result = {
        "baseline": names[0],
        "runs": [{"label": n, "run_dir": str(d), "kind": s.get("kind"),
                  "verdict": s["diagnosis"]["verdict"]}
                 for n, d, s in zip(names, dirs, summaries, strict=True)],
        "percentiles": list(percentiles),
        "rows": rows,
    }
    write_json(out / "compare.json", result)
    atomic_write_text(out / "compare.md", to_markdown(blocks, out))
    atomic_write_text(out / "compare.html", to_html(blocks, blocks[0].text))
    return result
