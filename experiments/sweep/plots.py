"""Comparison plots of a sweep: latency and goodput against the swept number, one line per
series, the seed mean with a min–max band (or, with no numeric axis, one point per series).

Uses ``reports.plots``' figure helpers (Agg canvas, fixed margins, PNG at the report DPI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reports.plots import new_figure, save

#: (panel title, y label, [(column, line style, legend suffix)])
PANELS: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    ("TTFT", "TTFT (ms)", (("p99_ttft_ms", "-o", "p99"), ("median_ttft_ms", "--", "median"))),
    ("TPOT", "TPOT (ms)", (("p99_tpot_ms", "-o", "p99"), ("median_tpot_ms", "--", "median"))),
    ("E2E latency", "E2EL (ms)", (("p99_e2el_ms", "-o", "p99"),
                                  ("median_e2el_ms", "--", "median"))),
    ("Goodput and throughput", "requests per second",
     (("request_goodput", "-o", "goodput"), ("request_throughput", ":", "throughput"))),
)


def _label(x_col: str | None) -> str:
    if x_col == "request_rate":
        return "request rate (req/s)"
    return x_col or "series"


def plot_comparison(
    table: pd.DataFrame, x_col: str | None, out_png: str | Path, title: str = ""
) -> Path:
    """Four panels (TTFT, TPOT, E2EL, goodput/throughput) of every series in ``table``."""
    categorical = x_col is None
    fig, axes = new_figure(2, 2, (11, 8.5 if categorical else 7.5), right=0.98, top=0.92,
                           left=0.12 if categorical else 0.08,
                           bottom=0.2 if categorical else 0.08, hspace=0.7 if categorical
                           else 0.42)
    series_names = list(dict.fromkeys(table["series"]))
    colours = [f"C{i % 10}" for i in range(len(series_names))]
    for ax, (panel, ylabel, lines) in zip(axes.flat, PANELS, strict=True):
        drawn = False
        for colour, series in zip(colours, series_names, strict=True):
            rows = table[table["series"] == series]
            for col, style, suffix in lines:
                if col not in rows or not rows[col].notna().any():
                    continue
                drawn |= _draw(ax, rows, x_col, col, style, colour, f"{series} {suffix}",
                               series_names.index(series))
        ax.set(title=panel, xlabel=_label(x_col), ylabel=ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, ncol=1 if categorical or len(series_names) < 4 else 2)
        if categorical:
            ax.set_xticks(range(len(series_names)))
            ax.set_xticklabels(series_names, rotation=15, fontsize=6, ha="right")
    fig.suptitle(f"{title}: seed mean, band = min–max over seeds" if title else "Sweep")
    return save(fig, out_png)


def _draw(
    ax: Any, rows: pd.DataFrame, x_col: str | None, col: str, style: str, colour: str,
    label: str, position: int,
) -> bool:
    if x_col is None:  # one column of markers per series; the legend names the statistic
        y = rows[col].astype(float)
        marker = "o" if style.endswith("o") else ("v" if style == "--" else "x")
        ax.errorbar([position], [y.mean()], yerr=[[y.mean() - y.min()], [y.max() - y.mean()]],
                    fmt=marker, color=colour, label=label.rpartition(" ")[2] if position == 0
                    else None)
        return True
    g = rows.groupby(x_col)[col].agg(["mean", "min", "max"]).sort_index()
    x = g.index.to_numpy(dtype=float)
    if not np.isfinite(x).any():
        return False
    ax.plot(x, g["mean"], style, color=colour, label=label, markersize=4)
    if len(rows) > len(g):
        ax.fill_between(x, g["min"], g["max"], color=colour, alpha=0.12)
    return True
