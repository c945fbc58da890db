"""The report's pictures, as PNG files (matplotlib's Agg canvas: headless, no global state).

Every plot has a title, axis labels with units and a legend. Sizes stay bounded whatever the
run's size: CDFs are drawn from ``stats.quantile_curve`` (exact up to 512 values, else 512
quantiles) and time series from ``timeseries.bin_steps`` (≤ 2,000 bins), so a million-request
run plots in about the time a small one does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reports.breakdown import PATHS, SEGMENTS, path_segments
from reports.itl import pooled_itls
from reports.stats import quantile_curve
from reports.tables import RunTables
from reports.timeseries import bin_steps

DPI = 110
#: coarser bins for the stacked batch-composition areas (single steps make unreadable spikes)
BATCH_BINS = 500
#: one colour per breakdown segment (stable across plots and runs)
SEGMENT_COLOURS: dict[str, str] = {
    "client_to_frontend": "#8c564b", "frontend_cpu": "#c49c94", "ipc_in": "#7f7f7f",
    "wait_token_budget": "#ff7f0e", "wait_max_num_seqs": "#bcbd22", "wait_kv_cache": "#d62728",
    "wait_preemption": "#ff9896", "wait_policy": "#e377c2", "wait_next_step": "#c7c7c7",
    "prefill": "#1f77b4",
    "decode": "#aec7e8", "output_first": "#2ca02c", "output_last": "#2ca02c",
}
METRIC_LABELS: dict[str, str] = {
    "ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL",
}


#: fixed margins: a layout engine would draw every figure twice (half the plotting time)
_MARGINS: dict[str, float] = {
    "left": 0.08, "right": 0.97, "bottom": 0.08, "top": 0.9, "hspace": 0.42, "wspace": 0.25,
}


def new_figure(nrows: int, ncols: int, size: tuple[float, float], **margins: float) -> Any:
    """A Figure on an Agg canvas, and its axes (always a 2-D array)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    fig.subplots_adjust(**{**_MARGINS, **margins})
    return fig, axes


def save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


@dataclass(frozen=True, slots=True)
class Curve:
    """One metric's CDF for plotting, with its exact median and p99 (numpy.percentile)."""

    x_ms: np.ndarray  # values, ms
    fraction: np.ndarray  # cumulative fraction at each value
    p50_ms: float
    p99_ms: float


def latency_curves(tables: RunTables) -> dict[str, Curve]:
    """The CDFs of TTFT, TPOT, ITL and E2EL over successful requests."""
    req = tables.requests
    ok = req["success"].to_numpy(dtype=bool)
    itl = pooled_itls(tables, ok)
    data: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        key: (req[f"{key}_s"].to_numpy(dtype=np.float64)[ok], None)
        for key in ("ttft", "tpot", "e2el")
    }
    data["tpot"] = (data["tpot"][0][~np.isnan(data["tpot"][0])], None)
    data["itl"] = (itl.values, itl.weights)
    out = {}
    for key in ("ttft", "tpot", "itl", "e2el"):
        values, weights = data[key]
        x, f, (p50, p99) = quantile_curve(values, weights, percentiles=(50.0, 99.0))
        out[key] = Curve(x * 1000, f, float(p50) * 1000, float(p99) * 1000)
    return out


def _cdf_axes(ax: Any, key: str) -> None:
    unit = "gaps" if key == "itl" else "requests"
    ax.set_title(f"{METRIC_LABELS[key]} CDF")
    ax.set_xlabel(f"{METRIC_LABELS[key]} (ms)")
    ax.set_ylabel(f"fraction of {unit}")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)


def _step(ax: Any, c: Curve, **style: Any) -> None:
    """The CDF as a step function rising from 0 at the smallest value."""
    ax.step(np.append(c.x_ms[:1], c.x_ms), np.append(0.0, c.fraction), where="post", **style)


def _maybe_log(ax: Any, xs: Sequence[np.ndarray]) -> None:
    pos = np.concatenate([x[x > 0] for x in xs]) if xs else np.zeros(0)
    if len(pos) and pos.max() / pos.min() > 100:
        ax.set_xscale("log")


def plot_latency_cdfs(tables: RunTables, out_png: str | Path, title: str = "") -> Path:
    """TTFT, TPOT, ITL and E2EL CDFs, with the median and p99 marked."""
    fig, axes = new_figure(2, 2, (10, 7))
    curves = latency_curves(tables)
    for ax, key in zip(axes.flat, ("ttft", "tpot", "itl", "e2el"), strict=True):
        _cdf_axes(ax, key)
        c = curves[key]
        if len(c.x_ms) == 0:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
            continue
        _step(ax, c, color="#1f77b4", label="CDF")
        for q, xq, colour in ((0.5, c.p50_ms, "#2ca02c"), (0.99, c.p99_ms, "#d62728")):
            ax.plot([xq], [q], "o", color=colour, label=f"p{int(q * 100)} = {xq:.1f} ms")
        _maybe_log(ax, [c.x_ms])
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title or "Client-side latency distributions (successful requests)")
    return save(fig, out_png)


def plot_kv_and_queues(tables: RunTables, out_png: str | Path) -> Path:
    """KV usage (%) and running/waiting request counts over time; preemptions marked."""
    cols = ["kv_usage", "num_running", "num_waiting", "num_preempted_reqs"]
    b = bin_steps(tables.steps, cols)
    fig, axes = new_figure(2, 1, (10, 6.5), top=0.94)
    ax_kv, ax_q = axes[0, 0], axes[1, 0]
    ax_kv.fill_between(b.time_s, 100 * b.max["kv_usage"], color="#aec7e8", alpha=0.6,
                       label="KV usage, max per bin")
    ax_kv.plot(b.time_s, 100 * b.mean["kv_usage"], color="#1f77b4", label="KV usage, mean")
    ax_kv.axhline(95, color="#d62728", ls="--", lw=1, label="95%")
    pre = b.total["num_preempted_reqs"] > 0
    if pre.any():
        ax_kv.plot(b.time_s[pre], np.full(pre.sum(), 2.0), "|", color="#d62728", ms=10,
                   label=f"preemptions ({int(b.total['num_preempted_reqs'].sum())})")
    ax_kv.set(title="KV-cache usage over time", ylabel="KV blocks in use (%)", ylim=(0, 105))
    ax_kv.legend(loc="upper right", fontsize=8)
    ax_q.plot(b.time_s, b.mean["num_running"], color="#2ca02c", label="running (mean)")
    ax_q.plot(b.time_s, b.mean["num_waiting"], color="#ff7f0e", label="waiting (mean)")
    ax_q.set(title="Scheduler queues over time", ylabel="requests",
             xlabel="time since first step (s)")
    ax_q.legend(loc="upper right", fontsize=8)
    for ax in (ax_kv, ax_q):
        ax.grid(alpha=0.3)
        ax.set_xlim(0, max(float(b.time_s[-1] + b.width_s / 2), 1e-9) if len(b.time_s) else 1)
    return save(fig, out_png)


def plot_batch_composition(
    tables: RunTables, out_png: str | Path, token_budget: int | None = None
) -> Path:
    """Prefill vs decode tokens, and prefill vs decode requests, per step over time."""
    steps = tables.steps.assign(
        num_decode_tokens=tables.steps["num_tokens"] - tables.steps["num_prefill_tokens"]
    )
    cols = ["num_prefill_tokens", "num_decode_tokens", "num_prefill_reqs", "num_decode_reqs"]
    b = bin_steps(steps, cols, max_bins=BATCH_BINS)
    m = {c: np.nan_to_num(b.mean[c]) for c in cols}
    fig, axes = new_figure(2, 1, (10, 6.5), top=0.94)
    ax_t, ax_r = axes[0, 0], axes[1, 0]
    ax_t.stackplot(b.time_s, m["num_decode_tokens"], m["num_prefill_tokens"],
                   colors=["#aec7e8", "#1f77b4"], labels=["decode tokens", "prefill tokens"])
    peak = float((m["num_decode_tokens"] + m["num_prefill_tokens"]).max()) if len(b.time_s) else 0
    if token_budget and peak >= 0.3 * token_budget:
        ax_t.axhline(token_budget, color="#d62728", ls="--", lw=1,
                     label=f"token budget ({token_budget})")
    ax_t.set(title="Batch composition over time: scheduled tokens (mean per step in each bin)",
             ylabel="tokens per step")
    ax_r.stackplot(b.time_s, m["num_decode_reqs"], m["num_prefill_reqs"],
                   colors=["#ffbb78", "#ff7f0e"],
                   labels=["decode requests", "prefill requests (incl. chunks)"])
    ax_r.set(title="Batch composition over time: scheduled requests (mean per step in each bin)",
             ylabel="requests per step", xlabel="time since first step (s)")
    for ax in (ax_t, ax_r):
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
        if len(b.time_s):
            ax.set_xlim(0, float(b.time_s[-1] + b.width_s / 2))
    return save(fig, out_png)


def plot_breakdown(breakdown: Mapping[str, Any], out_png: str | Path) -> Path:
    """Stacked bars of the breakdown segments (ms) at p50, p99 and on average, per path."""
    fig, axes = new_figure(2, 1, (11, 6.5), left=0.09, right=0.7, top=0.89)
    used: dict[str, Any] = {}
    for ax, path in zip(axes[:, 0], PATHS, strict=True):
        leaves = [(at, breakdown[path][at]) for at in ("p50", "p99", "mean")
                  if at in breakdown.get(path, {})]
        for row, (_, leaf) in enumerate(leaves):
            left = 0.0
            for seg in path_segments(path):
                ms = leaf["segments_ms"][seg.name]
                if ms <= 0:
                    continue
                bar = ax.barh(row, ms, left=left, color=SEGMENT_COLOURS[seg.name],
                              edgecolor="white", lw=0.5)
                used.setdefault(seg.label, bar)
                share = leaf["shares"][seg.name]
                if share >= 0.07:
                    ax.text(left + ms / 2, row, f"{100 * share:.0f}%", ha="center",
                            va="center", fontsize=8, color="black")
                left += ms
        ax.set_yticks(range(len(leaves)), [f"{path.upper()} {at}" for at, _ in leaves])
        ax.invert_yaxis()
        ax.set(title=f"Where the {path.upper()} went", xlabel=f"{path.upper()} (ms)")
        ax.grid(axis="x", alpha=0.3)
    order = list(dict.fromkeys(s.label for s in SEGMENTS if s.label in used))
    fig.legend([used[k] for k in order], order, loc="center right", fontsize=8,
               title="segment (path order)")
    fig.suptitle("Request-path breakdown (mean of the requests around each percentile)")
    return save(fig, out_png)


def _sweep_value(s: Mapping[str, Any], key: str) -> float:
    v = s.get(key)
    return float(v) if isinstance(v, (int, float)) else np.nan


def plot_rate_sweep(summaries: Sequence[Mapping[str, Any]], out_png: str | Path) -> Path:
    """Latency percentiles and throughput/goodput against the request rate of each run."""
    runs = [s for s in summaries if isinstance(s.get("request_rate"), (int, float))]
    runs.sort(key=lambda s: float(s["request_rate"]))
    rate = np.array([float(s["request_rate"]) for s in runs])
    fig, axes = new_figure(2, 2, (10, 7))
    for ax, key in zip(axes.flat[:3], ("ttft", "tpot", "e2el"), strict=True):
        for stat, style in (("median", "-o"), ("p90", "--s"), ("p99", ":^")):
            y = np.array([_sweep_value(s, f"{stat}_{key}_ms") for s in runs])
            if len(y) and not np.all(np.isnan(y)):
                ax.plot(rate, y, style, label=f"{stat} {METRIC_LABELS[key]}")
        ax.set(title=f"{METRIC_LABELS[key]} vs request rate", xlabel="request rate (req/s)",
               ylabel=f"{METRIC_LABELS[key]} (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[1, 1]
    ax.plot(rate, [_sweep_value(s, "request_throughput") for s in runs], "-o",
            label="throughput")
    good = np.array([_sweep_value(s, "request_goodput") for s in runs])
    if len(good) and not np.all(np.isnan(good)):
        ax.plot(rate, good, "-s", label="goodput (all SLOs met)")
    if len(rate):
        ax.plot(rate, rate, ":", color="grey", label="offered load")
    ax.set(title="Throughput and goodput vs request rate", xlabel="request rate (req/s)",
           ylabel="completed requests per second")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("Rate sweep")
    return save(fig, out_png)


def plot_overlaid_cdfs(
    curves_by_run: Mapping[str, Mapping[str, Curve]], out_png: str | Path
) -> Path:
    """The TTFT/TPOT/ITL/E2EL CDFs of several runs, one line per run (from ``latency_curves``)."""
    fig, axes = new_figure(2, 2, (10, 7))
    for ax, key in zip(axes.flat, ("ttft", "tpot", "itl", "e2el"), strict=True):
        _cdf_axes(ax, key)
        xs = []
        for label, curves in curves_by_run.items():
            c = curves[key]
            if len(c.x_ms):
                _step(ax, c, label=f"{label} (p99 {c.p99_ms:.1f} ms)")
                xs.append(c.x_ms)
        _maybe_log(ax, xs)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Latency distributions, run by run")
    return save(fig, out_png)


def plot_run(
    tables: RunTables, summary: Mapping[str, Any], plots_dir: str | Path,
    token_budget: int | None = None,
) -> dict[str, Path]:
    """All single-run plots into ``plots_dir``; returns {name: path}."""
    d = Path(plots_dir)
    return {
        "latency_cdfs": plot_latency_cdfs(tables, d / "latency_cdfs.png"),
        "breakdown": plot_breakdown(summary["breakdown"], d / "breakdown.png"),
        "kv_and_queues": plot_kv_and_queues(tables, d / "kv_and_queues.png"),
        "batch_composition": plot_batch_composition(
            tables, d / "batch_composition.png", token_budget
        ),
    }


__all__ = [
    "Curve",
    "latency_curves",
    "plot_batch_composition",
    "plot_breakdown",
    "plot_kv_and_queues",
    "plot_latency_cdfs",
    "plot_overlaid_cdfs",
    "plot_rate_sweep",
    "plot_run",
]
