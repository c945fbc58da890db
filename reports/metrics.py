"""The run summary: ``vllm bench serve --save-result`` keys and units, plus our own sections.

``summarize`` follows vllm 0.33.0's ``calculate_metrics`` and ``benchmark`` (METRICS.md §1):

* successful requests are those that finished normally with at least one output token; the
  others count as ``failed``; totals and latency statistics cover successful requests only;
* TTFT/E2EL are client-side (first/last token delivery − send); TPOT = (E2EL − TTFT)/(n − 1)
  over requests with n > 1 output tokens; ITLs are pooled over requests (``itl.pooled_itls``);
* ``mean_/median_/std_/p{P}_{metric}_ms`` for each selected metric, in vllm's order (ttft, tpot,
  itl, e2el) with vllm's key spelling (``p99``, ``p99.9``); null where no request gives the
  metric a value (vllm writes 0, which would read as a perfect latency of a run in which
  nothing completed);
* ``duration`` = first send → last completion (incl. failures); throughputs divide by it;
* goodput (DistServe): requests meeting every given SLO — a request with ≤ 1 output token has
  TPOT 0 — divided by the duration; ``request_goodput`` is null without SLOs, as in vllm.

Per-request arrays (``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``latencies``,
``start_times``, ``errors``) are written only with ``detailed=True`` (METRICS.md §1; vllm's
``--save-detailed``), since they are large. Our own keys follow vllm's: ``slo_attainment``,
``breakdown``, ``engine``, ``diagnosis``, ``kind``, ``config``, ``seed``, ``version``,
``git_commit``, ``report_options``; and, for a run whose requests carry tenants or SLO
classes, ``by_tenant`` / ``by_slo_class`` (``reports.classes``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from reports.breakdown import breakdown_summary
from reports.classes import group_breakdown
from reports.columns import RunColumns, as_columns
from reports.diagnosis import diagnose
from reports.engine_stats import engine_stats, run_span
from reports.itl import per_request_itls, per_second_peaks, pooled_itls
from reports.meta import RunMeta, meta_dict
from reports.options import check_goodput, parse_percentile_metrics, parse_percentiles
from reports.stats import (
    DEFAULT_PERCENTILE_METRICS,
    DEFAULT_PERCENTILES,
    MS_PER_S,
    PERCENTILE_METRICS,
    Describe,
    describe,
    describe_weighted,
    percentile_word,
)

# Re-exported: the printed summary is part of this module's interface.
from reports.stats import format_summary as format_summary

if TYPE_CHECKING:
    from reports.tables import RunTables


def _encode_rate(rate: Any) -> float | str | None:
    """vllm writes an infinite rate as "inf"; a trace replayed at its own times has none."""
    if rate is None or rate == "inf":
        return "inf" if rate == "inf" else None
    rate = float(rate)
    if math.isnan(rate):
        return None
    return "inf" if math.isinf(rate) else rate


def header_fields(meta: Mapping[str, Any], num_requests: int) -> dict[str, Any]:
    """vllm's leading keys (date … max_concurrency) from the run's metadata."""
    config = meta.get("config") or {}
    workload = {**(config.get("workload") or {}), **(meta.get("workload") or {})}
    kind = meta.get("kind", "simulated")
    backend = meta.get("backend") or ("twinserve-sim" if kind == "simulated" else "twinserve")
    model_id = meta.get("model_id") or config.get("model")
    return {
        "date": meta.get("date") or datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": meta.get("label"),
        "model_id": model_id,
        "tokenizer_id": meta.get("tokenizer_id") or model_id,
        "num_prompts": int(workload.get("num_prompts") or num_requests),
        "request_rate": _encode_rate(workload.get("request_rate", math.inf)),
        "burstiness": float(workload.get("burstiness", 1.0)),
        "max_concurrency": workload.get("max_concurrency"),
    }


def goodput_mask(
    ttft_s: np.ndarray, all_tpot_s: np.ndarray, e2el_s: np.ndarray, goodput: Mapping[str, float]
) -> np.ndarray:
    """Requests meeting every SLO of ``goodput`` (ms), compared as vllm does (slo_s >= value)."""
    good = np.ones(len(ttft_s), dtype=bool)
    for name, values in (("ttft", ttft_s), ("tpot", all_tpot_s), ("e2el", e2el_s)):
        if name in goodput:
            good &= (goodput[name] / MS_PER_S) >= values
    return good


def _metric_fields(d: Describe, key: str) -> dict[str, float | None]:
    """vllm's keys of one metric; None (null) when no request gives it a value — vllm writes
    0 there, which reads as a perfect latency for a run in which nothing completed."""
    if d.count == 0:
        keys = [f"mean_{key}_ms", f"median_{key}_ms", f"std_{key}_ms"]
        keys += [f"p{percentile_word(p)}_{key}_ms" for p, _ in d.percentiles]
        return dict.fromkeys(keys)
    out: dict[str, float | None] = {
        f"mean_{key}_ms": d.mean * MS_PER_S,
        f"median_{key}_ms": d.median * MS_PER_S,
        f"std_{key}_ms": d.std * MS_PER_S,
    }
    for p, value in d.percentiles:
        out[f"p{percentile_word(p)}_{key}_ms"] = value * MS_PER_S
    return out


def metric_describes(tables: RunTables | RunColumns, percentiles: Sequence[float]
                     ) -> dict[str, Describe]:
    """TTFT, TPOT, ITL and E2EL aggregates (seconds) over successful requests."""
    tables = as_columns(tables)
    req = tables.requests
    ok = req.array("success", bool)
    n_out = req.array("num_output_tokens")
    itl = pooled_itls(tables, ok)
    return {
        "ttft": describe(req.array("ttft_s", np.float64)[ok], percentiles),
        "tpot": describe(req.array("tpot_s", np.float64)[ok & (n_out > 1)], percentiles),
        "itl": describe_weighted(itl.values, itl.weights, percentiles),
        "e2el": describe(req.array("e2el_s", np.float64)[ok], percentiles),
    }


def summarize(
    tables: RunTables | RunColumns,
    meta: RunMeta | Mapping[str, Any],
    *,
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    percentile_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
    detailed: bool = False,
) -> dict[str, Any]:
    """The summary dict (``summary.json``) of one run (from its tables as columns or as
    DataFrames: the same summary); see the module docstring."""
    tables = as_columns(tables)
    meta = meta_dict(meta)
    percentiles = parse_percentiles(percentiles)
    selected = parse_percentile_metrics(percentile_metrics)
    check_goodput(goodput)
    goodput = dict(goodput or {})
    req = tables.requests
    ok = req.array("success", bool)
    start, end = run_span(req)
    duration = end - start
    dur = duration if duration > 0 else math.nan
    completed = int(ok.sum())
    total_in = int(req.array("num_prompt_tokens")[ok].sum())
    total_out = int(req.array("num_output_tokens")[ok].sum())
    ttft = req.array("ttft_s", np.float64)[ok]
    e2el = req.array("e2el_s", np.float64)[ok]
    all_tpot = np.nan_to_num(req.array("tpot_s", np.float64)[ok], nan=0.0)
    good = int(goodput_mask(ttft, all_tpot, e2el, goodput).sum()) if goodput else 0
    peak_tokens, peak_conc = per_second_peaks(tables, ok)
    out = header_fields(meta, len(req))
    out.update({
        "duration": duration,
        "completed": completed,
        "failed": len(req) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / dur,
        "request_goodput": good / dur if goodput else None,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
    })
    if detailed:
        out.update(_details(tables, ok))
    out.update({"max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_conc,
                "rtfx": 0.0})
    describes = metric_describes(tables, percentiles)
    for key in PERCENTILE_METRICS:
        if key in selected:
            out.update(_metric_fields(describes[key], key))
    out.update(_own_fields(tables, meta, goodput, ttft, all_tpot, e2el, duration))
    out.update(group_breakdown(tables, meta, goodput, duration))
    out["report_options"] = {
        "goodput": goodput, "percentiles": percentiles, "percentile_metrics": selected,
        "detailed": detailed,
    }
    return out


def _own_fields(
    tables: RunColumns,
    meta: Mapping[str, Any],
    goodput: Mapping[str, float],
    ttft: np.ndarray,
    all_tpot: np.ndarray,
    e2el: np.ndarray,
    duration: float,
) -> dict[str, Any]:
    """Our keys after vllm's: SLO attainment, breakdown, engine stats, diagnosis, provenance."""
    attainment: dict[str, float] | None = None
    if goodput:
        n = len(ttft)
        attainment = {
            name: float(goodput_mask(ttft, all_tpot, e2el, {name: v}).mean()) if n else 0.0
            for name, v in goodput.items()
        }
        attainment["all"] = float(goodput_mask(ttft, all_tpot, e2el, goodput).mean()) if n else 0.0
    breakdown = breakdown_summary(tables.requests)
    engine = engine_stats(tables, meta, duration)
    diagnosis = diagnose(tables, meta, breakdown=breakdown, engine=engine)
    return {
        "goodput_slos_ms": dict(goodput) or None,
        "slo_attainment": attainment,
        "breakdown": breakdown,
        "engine": engine,
        "diagnosis": diagnosis.to_dict(),
        "kind": meta.get("kind", "simulated"),
        "config": meta.get("config"),
        "seed": meta.get("seed", (meta.get("config") or {}).get("seed")),
        "version": meta.get("version"),
        "git_commit": meta.get("git_commit"),
    }


def _details(tables: RunColumns, ok: np.ndarray) -> dict[str, Any]:
    """vllm's ``--save-detailed`` arrays (seconds), one entry per request in req order."""
    req = tables.requests
    itls: list[list[float]] = [[] for _ in range(len(req))]
    for i, gaps in zip(np.flatnonzero(ok).tolist(), per_request_itls(tables, ok), strict=True):
        itls[i] = gaps
    zero = np.zeros(len(req))
    rejected = req.labels("rejected_reason")  # else the finish reason ("nan": neither)
    errors = np.where(rejected.codes >= 0, rejected.strings(),
                      req.labels("finish_reason").strings(missing="nan"))
    return {
        "input_lens": req.array("num_prompt_tokens").tolist(),
        "output_lens": np.where(ok, req.array("num_output_tokens"), 0).tolist(),
        "ttfts": np.where(ok, req.array("ttft_s"), zero).tolist(),
        "itls": itls,
        "latencies": np.where(ok, req.array("e2el_s"), zero).tolist(),
        "start_times": req.array("arrival_s").tolist(),
        "errors": ["" if good else str(e) for good, e in zip(ok, errors, strict=True)],
    }
