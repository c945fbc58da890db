"""Engine-side statistics (METRICS.md §2) from the step and request tables.

Per-step quantities that describe a *state* (KV usage, running and waiting counts) are
time-weighted: the state recorded after step ``k``'s update holds until step ``k+1``'s update
of the same engine. With several data-parallel engines (``replica``) they are per engine,
averaged over engines; the GPU busy fraction is per engine too.
Per-request intervals (queue, prefill, decode, inference) are those vLLM's engine records:
queued → first scheduled, first scheduled → first token (preemptions included), first → last
token, first scheduled → last token.

Prefix caching: ``prefix_cache_queries_tokens`` counts the prompt tokens of each first
admission and ``prefix_cache_hits_tokens`` the tokens found cached then (the ``SCHEDULED``
payload), so the hit rate is per prompt token at first admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from reports.columns import ColumnTable, Labels, RunColumns, as_columns
from reports.stats import describe

if TYPE_CHECKING:
    from reports.tables import RunTables

#: KV usage at or above this counts as "full" for the diagnosis and the report.
KV_FULL_THRESHOLD = 0.95
_INTERVALS = ("queue_time", "prefill_time", "decode_time", "inference_time")


def _time_weights(steps: ColumnTable) -> np.ndarray:
    """Seconds each step's post-update state held, until its engine's next step (last: 0)."""
    t = steps.array("update_time_s", np.float64)
    if len(t) == 0:
        return np.zeros(0)
    if "replica" not in steps:
        return np.asarray(np.maximum(np.append(np.diff(t), 0.0), 0.0), dtype=np.float64)
    replica = steps.array("replica")
    order = np.lexsort((t, replica))
    ts = t[order]
    held = np.empty_like(ts)  # the gaps to the next step, worked out in place (one array)
    np.subtract(ts[1:], ts[:-1], out=held[:-1])
    held[-1] = 0.0
    del ts
    rs = replica[order]
    held[:-1][rs[1:] != rs[:-1]] = 0.0  # an engine's last step: no next one, 0 s
    del rs
    np.maximum(held, 0.0, out=held)
    out = np.empty_like(held)
    out[order] = held
    return out


def blocker_fractions(blockers: Labels) -> dict[str, float]:
    """The fraction of steps per admission blocker ("" is "none"), most frequent first (ties in
    order of first appearance; missing values not counted): pandas' ``value_counts(normalize=
    True)`` of the blockers as strings, counted on their codes — no string per step (two
    million of them at a million requests)."""
    present = blockers.first_appearance()
    counts = blockers.counts()[present]
    total = counts.sum()
    names = ["none" if blockers.categories[c] == "" else blockers.categories[c]
             for c in present.tolist()]
    return {names[i]: float(counts[i] / total) for i in np.argsort(-counts, kind="stable")}


def _value_counts(labels: Labels) -> dict[str, int]:
    """Rows per category, most frequent first (ties in category order; categories no row has
    left out): pandas' ``value_counts()`` of a categorical column, without its zeros."""
    counts = labels.counts()
    order = np.argsort(-counts, kind="stable")
    return {labels.categories[i]: int(counts[i]) for i in order.tolist() if counts[i]}


def _mean(values: np.ndarray) -> float:
    """The mean as pandas computes it for a column (summed as float64)."""
    return float(values.sum(dtype=np.float64) / len(values))


def _weighted_mean(x: np.ndarray, w: np.ndarray) -> float:
    total = w.sum()
    if total > 0:
        return float(np.dot(x, w) / total)
    return float(x.mean()) if len(x) else 0.0


def run_span(requests: ColumnTable) -> tuple[float, float]:
    """(first send, last completion) over all requests: vllm bench's benchmark duration span."""
    start = requests.array("arrival_s", np.float64)
    ends = np.column_stack([
        requests.array(c, np.float64)
        for c in ("last_token_delivered_s", "delivered_s", "rejected_s")
    ])
    if len(start) == 0 or np.all(np.isnan(start)):
        return 0.0, 0.0
    first = float(np.nanmin(start))
    last = float(np.nanmax(ends)) if not np.all(np.isnan(ends)) else first
    return first, max(last, first)


def engine_stats(tables: RunTables | RunColumns, meta: Mapping[str, Any], duration_s: float
                 ) -> dict[str, Any]:
    """The engine section of the summary (times in ms, fractions in [0, 1])."""
    tables = as_columns(tables)
    steps, req = tables.steps, tables.requests
    w = _time_weights(steps)
    kv = steps.array("kv_usage", np.float64)
    running = steps.array("num_running", np.float64)
    waiting = steps.array("num_waiting", np.float64)
    cost = steps.array("cost_s", np.float64)
    step = describe(cost, (50.0, 99.0))
    first_adm = ~np.isnan(req.array("scheduled_s", np.float64))
    queries = int(req.array("num_prompt_tokens")[first_adm].sum())
    hits = int(req.array("prefix_hit_tokens")[first_adm].sum())
    num_replicas = (len(np.unique(steps.array("replica"))) if "replica" in steps and len(steps)
                    else 1)
    preemptions = req.array("num_preemptions")
    batch, tokens = steps.array("num_reqs"), steps.array("num_tokens")
    out: dict[str, Any] = {
        "num_replicas": num_replicas,  # data-parallel engines; per-step stats are per engine
        "num_steps": len(steps),
        "num_preemptions": int(preemptions.sum()),
        "num_preempted_requests": int((preemptions > 0).sum()),
        "num_rejected": int((~np.isnan(req.array("rejected_s", np.float64))).sum()),
        "mean_batch_size": _mean(batch) if len(steps) else 0.0,
        "max_batch_size": int(batch.max()) if len(steps) else 0,
        "mean_scheduled_tokens": _mean(tokens) if len(steps) else 0.0,
        "max_scheduled_tokens": int(tokens.max()) if len(steps) else 0,
        "mean_step_time_ms": step.mean * 1000,
        "median_step_time_ms": step.median * 1000,
        "p99_step_time_ms": step.percentiles[1][1] * 1000,
        "max_step_time_ms": float(cost.max()) * 1000 if len(cost) else 0.0,
        "gpu_busy_fraction": (
            float(cost.sum() / duration_s / num_replicas) if duration_s > 0 else 0.0
        ),
        "mean_kv_usage": _weighted_mean(kv, w),
        "max_kv_usage": float(kv.max()) if len(kv) else 0.0,
        "kv_full_time_fraction": _weighted_mean((kv >= KV_FULL_THRESHOLD).astype(float), w),
        "mean_num_running": _weighted_mean(running, w),
        "max_num_running": int(running.max()) if len(running) else 0,
        "mean_num_waiting": _weighted_mean(waiting, w),
        "max_num_waiting": int(waiting.max()) if len(waiting) else 0,
        "prefix_cache_queries_tokens": queries,
        "prefix_cache_hits_tokens": hits,
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "admission_blocker_step_fractions": blocker_fractions(steps.labels("admission_blocker")),
        "finish_reasons": _value_counts(req.labels("finish_reason")),
    }
    ok = req.array("success", bool)
    for name in _INTERVALS:
        d = describe(req.array(f"{name}_s", np.float64)[ok], (99.0,))
        out[f"mean_{name}_ms"] = d.mean * 1000
        out[f"median_{name}_ms"] = d.median * 1000
        out[f"p99_{name}_ms"] = d.percentiles[0][1] * 1000
    out.update(utilisation(tables, meta, duration_s))
    return out


def utilisation(
    tables: RunColumns, meta: Mapping[str, Any], duration_s: float
) -> dict[str, float | int | None]:
    """Busy fractions of the front end (per API server) and of the output processor.

    Uses the run's recorded busy seconds (``meta["stats"]``) when present; otherwise the
    front end's busy time is the sum of the requests' front-end CPU segments (the output
    processor's cannot be told from the log: None).
    """
    stats = meta.get("stats") or {}
    frontend_cfg = (meta.get("config") or {}).get("frontend") or {}
    num_api = int(frontend_cfg.get("num_api_servers") or meta.get("num_api_servers") or 1)
    api_busy = stats.get("api_server_busy_s")
    if api_busy is None:
        api_busy = float(np.nansum(tables.requests.array("seg_frontend_cpu_s")))
    out_busy = stats.get("output_processor_busy_s")
    if duration_s <= 0:
        return {"num_api_servers": num_api, "frontend_utilization": 0.0,
                "output_processor_utilization": None}
    return {
        "num_api_servers": num_api,
        "frontend_utilization": float(api_busy) / duration_s / num_api,
        "output_processor_utilization": (
            None if out_busy is None else float(out_busy) / duration_s
        ),
    }
