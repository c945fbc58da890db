"""Results by tenant and by SLO class: each group's latency, SLO attainment, goodput and
rejections.

A run whose requests carry labels (the requests table's ``tenant`` / ``slo_class`` columns)
gets one row per tenant and one per SLO class. Per group: ``num_requests``, ``completed``,
``rejected`` (by the admission rule, or shed by the scheduling policy), ``failed`` (the rest
that did not complete); median and p99 TTFT, TPOT and E2EL in ms over its completed requests;
``slo_attainment``, the share of *all* its requests that completed and met their SLO (a
rejected or failed request misses: shedding cannot improve it by dropping requests), and
``goodput`` (req/s), those requests over the run's duration.

A request's SLO is its own class's TTFT and TPOT targets (the run's config
``workload.slo_classes``, ``[name, ttft_ms, tpot_ms]``); a request without a class is held to
the run's ``--goodput`` SLOs when there are some (attainment and goodput are None for a group
with neither). TPOT of a one-token request counts as 0, as vllm bench's goodput does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from reports.columns import ColumnTable, RunColumns, as_columns

if TYPE_CHECKING:
    from reports.tables import RunTables

#: The label columns, and the summary key of each one's breakdown.
GROUPS: dict[str, str] = {"tenant": "by_tenant", "slo_class": "by_slo_class"}
#: The per-group figures, in the order reports show them.
FIELDS: tuple[str, ...] = (
    "num_requests", "completed", "rejected", "failed", "median_ttft_ms", "p99_ttft_ms",
    "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms", "slo_attainment",
    "goodput",
)


def class_slos_ms(meta: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """{class name: (ttft_ms, tpot_ms)} from the run's config (empty when it has none)."""
    workload = (meta.get("config") or {}).get("workload") or {}
    out: dict[str, tuple[float, float]] = {}
    for entry in workload.get("slo_classes") or ():
        name, ttft_ms, tpot_ms = entry
        out[str(name)] = (float(ttft_ms), float(tpot_ms))
    return out


def group_breakdown(
    tables: RunTables | RunColumns,
    meta: Mapping[str, Any],
    goodput: Mapping[str, float],
    duration_s: float,
) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """{"by_tenant": {tenant: figures}, "by_slo_class": {class: figures}} for the label
    columns the run has (empty without labels); see the module docstring."""
    req = as_columns(tables).requests
    present = [c for c in GROUPS if c in req]
    if not present:
        return {}
    meets = _meets_slo(req, class_slos_ms(meta), goodput)
    out: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for column in present:
        labels = req.labels(column).strings(missing="nan")
        groups: dict[str, dict[str, float | int | None]] = {}
        for name in sorted(set(labels.tolist())):
            sel = labels == name
            groups[name] = _figures(req, sel, meets, duration_s)
        out[GROUPS[column]] = groups
    return out


def _meets_slo(
    req: ColumnTable, slos: Mapping[str, tuple[float, float]], goodput: Mapping[str, float]
) -> np.ndarray:
    """Per request: 1 it completed within its SLO, 0 it did not, NaN no SLO applies."""
    n = len(req)
    ok = req.array("success", bool)
    ttft_ms = req.array("ttft_s", np.float64) * 1000
    tpot_ms = np.nan_to_num(req.array("tpot_s", np.float64), nan=0.0) * 1000
    e2el_ms = req.array("e2el_s", np.float64) * 1000
    ttft_lim = np.full(n, math.inf)
    tpot_lim = np.full(n, math.inf)
    e2el_lim = np.full(n, math.inf)
    has = np.zeros(n, dtype=bool)
    classes = (
        req.labels("slo_class").strings(missing="nan") if "slo_class" in req
        else np.full(n, "")
    )
    for name, (t, p) in slos.items():
        sel = classes == name
        ttft_lim[sel], tpot_lim[sel], has[sel] = t, p, True
    if goodput:
        rest = ~has
        ttft_lim[rest] = goodput.get("ttft", math.inf)
        tpot_lim[rest] = goodput.get("tpot", math.inf)
        e2el_lim[rest] = goodput.get("e2el", math.inf)
        has[rest] = True
    with np.errstate(invalid="ignore"):
        good = ok & (ttft_ms <= ttft_lim) & (tpot_ms <= tpot_lim) & (e2el_ms <= e2el_lim)
    return np.where(has, good.astype(np.float64), np.nan)


def _figures(
    req: ColumnTable, sel: np.ndarray, meets: np.ndarray, duration_s: float
) -> dict[str, float | int | None]:
    ok = req.array("success", bool) & sel
    rejected = ~np.isnan(req.array("rejected_s", np.float64)) & sel
    n_out = req.array("num_output_tokens")
    out: dict[str, float | int | None] = {
        "num_requests": int(sel.sum()),
        "completed": int(ok.sum()),
        "rejected": int(rejected.sum()),
        "failed": int(sel.sum() - ok.sum() - rejected.sum()),
    }
    for key, column, mask in (("ttft", "ttft_s", ok), ("tpot", "tpot_s", ok & (n_out > 1)),
                              ("e2el", "e2el_s", ok)):
        values = req.array(column, np.float64)[mask] * 1000
        out[f"median_{key}_ms"] = float(np.median(values)) if len(values) else None
        out[f"p99_{key}_ms"] = float(np.percentile(values, 99)) if len(values) else None
    m = meets[sel]
    if len(m) and not np.isnan(m).any():
        good = int(m.sum())
        out["slo_attainment"] = good / len(m)
        out["goodput"] = good / duration_s if duration_s > 0 else None
    else:
        out["slo_attainment"] = out["goodput"] = None
    return out


def flat_group_metrics(summary: Mapping[str, Any]) -> dict[str, float | int | None]:
    """The breakdowns as flat columns for sweep records: ``tenant_<name>_<figure>`` and
    ``class_<name>_<figure>``."""
    out: dict[str, float | int | None] = {}
    for key, prefix in (("by_tenant", "tenant"), ("by_slo_class", "class")):
        for name, figures in (summary.get(key) or {}).items():
            for figure, value in figures.items():
                out[f"{prefix}_{name}_{figure}"] = value
    return out
