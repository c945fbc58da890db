"""Plots of the ``policies_bursty.toml`` sweep: what each scheduling policy does for each SLO
class and tenant as the load grows.

``python -m experiments.examples.plot_policies RUN_DIR [--out DIR]`` reads the sweep's
``results.csv`` and writes two figures (into ``RUN_DIR/plots`` unless ``--out``):

* ``policies_classes.png`` — per SLO class against the load (the trace replayed 1×, 1.5×,
  2× faster): the share of the class's requests that completed within its SLO (a shed request
  misses), p99 TTFT and p99 TPOT of its completed requests (the class's targets dotted); and
  the interactive requests shed;
* ``policies_tenants.png`` — p99 TTFT of each tenant against the load.

One line per policy; the columns are the sweep record's ``class_<name>_*`` and
``tenant_<name>_*`` (``reports.classes``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from reports.plots import new_figure, save

X = "workload.trace_time_scale"
CLASSES = ("interactive", "batch")
TENANTS = ("chat", "agent", "batch")


#: Marker and line style per policy, so that policies whose figures coincide (sjf and srpt
#: where nothing is preempted) stay visible: later lines are thinner and dashed on top.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*")
STYLES = ("-", "--", "-", "--", "-", "--", "-", "--")


def _lines(ax: object, table: pd.DataFrame, column: str, logy: bool = False) -> None:
    for i, (policy, rows) in enumerate(table.groupby("engine.policy", sort=False)):
        rows = rows.sort_values(X)
        ax.plot(rows[X], rows[column], linestyle=STYLES[i % 8], marker=MARKERS[i % 8],  # type: ignore[attr-defined]
                color=f"C{i % 10}", label=policy, markersize=5 - 0.3 * (i % 8),
                linewidth=2.4 - 0.2 * (i % 8), markerfacecolor="none" if i % 2 else None)
    if logy:
        ax.set_yscale("log")  # type: ignore[attr-defined]
    ax.grid(alpha=0.3)  # type: ignore[attr-defined]


def _slo_targets(table: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Each class's TTFT and TPOT targets (ms), from the workload's ``slo_classes`` column."""
    out: dict[tuple[str, str], float] = {}
    for name, ttft_ms, tpot_ms in json.loads(table["workload.slo_classes"].iloc[0]):
        out[name, "p99_ttft_ms"] = float(ttft_ms)
        out[name, "p99_tpot_ms"] = float(tpot_ms)
    return out


def plot_classes(table: pd.DataFrame, out: Path) -> Path:
    fig, axes = new_figure(len(CLASSES), 4, (15, 6.5), left=0.05, right=0.99, top=0.9,
                           bottom=0.09, wspace=0.3, hspace=0.45)
    panels = (("slo_attainment", "SLO attainment", False), ("p99_ttft_ms", "p99 TTFT (ms)", True),
              ("p99_tpot_ms", "p99 TPOT (ms)", True))
    targets = _slo_targets(table)
    for row, cls in enumerate(CLASSES):
        for col, (figure, label, logy) in enumerate(panels):
            ax = axes[row, col]
            _lines(ax, table, f"class_{cls}_{figure}", logy)
            ax.set(title=f"{cls}: {label}", xlabel="load (trace replayed × faster)")
            if (cls, figure) in targets:
                ax.axhline(targets[cls, figure], color="black", linestyle=":", linewidth=1,
                           label="SLO")
    _lines(axes[0, 3], table, f"class_{CLASSES[0]}_rejected")
    axes[0, 3].set(title=f"{CLASSES[0]}: requests shed", xlabel="load (trace replayed × faster)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    axes[1, 3].axis("off")
    axes[1, 3].legend(handles, labels, loc="center", title="policy", fontsize=9)
    fig.suptitle("Scheduling policies on a bursty multi-tenant trace, per SLO class "
                 "(dotted: the class's target)")
    return save(fig, out / "policies_classes.png")


def plot_tenants(table: pd.DataFrame, out: Path) -> Path:
    fig, axes = new_figure(1, len(TENANTS), (13, 3.8), left=0.06, right=0.88, top=0.84,
                           bottom=0.15, wspace=0.3)
    for ax, tenant in zip(axes[0], TENANTS, strict=True):
        _lines(ax, table, f"tenant_{tenant}_p99_ttft_ms", logy=True)
        ax.set(title=f"tenant {tenant}: p99 TTFT (ms)", xlabel="load (trace replayed × faster)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", title="policy", fontsize=8)
    fig.suptitle("p99 time to first token of each tenant")
    return save(fig, out / "policies_tenants.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("run_dir", type=Path, help="the sweep's --out directory")
    p.add_argument("--out", type=Path, help="where to write the PNGs (default RUN_DIR/plots)")
    args = p.parse_args(argv)
    table = pd.read_csv(args.run_dir / "results.csv")
    out = args.out or args.run_dir / "plots"
    for path in (plot_classes(table, out), plot_tenants(table, out)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
