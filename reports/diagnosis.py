"""A plain-words diagnosis of a run's bottleneck, following the request path (METRICS.md §3).

The verdict comes from where the p99 request's time went and how loaded each stage was:

1. *Pressure scores* — shares of the p99 TTFT request spent queueing for a stage:
   front end (network/API-server queue + front-end CPU), queue/KV (waiting for KV blocks,
   preemption steps, ``max_num_seqs``), compute (waiting because the steps' token budget was
   full: the GPU cannot take more prefill work), output (output processing before the first
   token reached the client; or before the last one, at p99 E2EL). A request's own prefill and
   decode, and its wait for the engine loop's next iteration (``ipc_in``, ``wait_next_step``),
   are service time at any load, not queueing, and score nothing.
2. The verdict is the stage with the largest score if it reaches ``SCORE_THRESHOLD``.
3. Otherwise a saturated stage still decides: KV usage ≥ 95% for ≥ ``KV_FULL_TIME`` of the run
   with preemptions (queue/KV), an API server or the output processor busy ≥
   ``BUSY_THRESHOLD`` of the run (front end, output).
4. Otherwise the run is healthy — unless no request completed at all: then the verdict is
   "nothing-completed" and the paragraph names the commonest reasons requests were rejected.

The paragraph states the evidence (KV usage, preemptions, queue lengths, front-end utilisation,
step times) and what to try.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from reports.breakdown import breakdown_summary
from reports.columns import ColumnTable, RunColumns, as_columns
from reports.engine_stats import engine_stats, run_span
from reports.meta import RunMeta, meta_dict
from reports.stats import describe

if TYPE_CHECKING:
    from reports.tables import RunTables

VERDICTS: tuple[str, ...] = (
    "front-end-bound", "queue/KV-bound", "compute-bound", "output-bound", "healthy",
    "nothing-completed",
)
SCORE_THRESHOLD = 0.3  # share of the p99 TTFT request spent queueing at one stage
KV_FULL_TIME = 0.3  # fraction of the run with KV usage >= 95%
BUSY_THRESHOLD = 0.9  # busy fraction of an API server / the output processor

_SCORE_SEGMENTS: dict[str, tuple[str, ...]] = {
    "front-end-bound": ("client_to_frontend", "frontend_cpu"),
    "queue/KV-bound": (
        "wait_kv_cache", "wait_preemption", "wait_max_num_seqs", "wait_policy",
    ),
    "compute-bound": ("wait_token_budget",),
    "output-bound": ("output_first",),
}

_ADVICE: dict[str, str] = {
    "front-end-bound": (
        "more API-server processes (--api-server-count), cheaper chat templates and "
        "tokenization, or spreading the load over more front ends"
    ),
    "queue/KV-bound": (
        "more KV blocks (higher gpu_memory_utilization, tensor parallelism, a GPU with more "
        "memory), a lower max_num_seqs, shorter max_tokens, prefix caching, or another replica"
    ),
    "compute-bound": (
        "a lower request rate or another replica (data parallel), tensor parallelism or a "
        "faster GPU, prefix caching for shared prompts, or a different max_num_batched_tokens "
        "to trade TTFT against TPOT"
    ),
    "output-bound": (
        "faster detokenization (incremental, fewer stop strings), more front-end processes "
        "for output handling, or larger stream chunks"
    ),
    "healthy": (
        "raising the request rate to find the knee of the latency curve (a rate sweep), or "
        "serving the same load with fewer resources"
    ),
}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The verdict, the paragraph that explains it, and the numbers behind it."""

    verdict: str  # one of VERDICTS
    text: str  # one plain-words paragraph
    scores: dict[str, float] = field(default_factory=dict)  # pressure score per bottleneck
    evidence: dict[str, float | int | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ms(x: float) -> str:
    return f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.1f} ms"


def diagnose(
    tables: RunTables | RunColumns,
    meta: RunMeta | Mapping[str, Any],
    *,
    breakdown: Mapping[str, Any] | None = None,
    engine: Mapping[str, Any] | None = None,
) -> Diagnosis:
    """The bottleneck of the run (see the module docstring for the rules)."""
    tables = as_columns(tables)
    meta = meta_dict(meta)
    if breakdown is None:
        breakdown = breakdown_summary(tables.requests)
    if engine is None:
        start, end = run_span(tables.requests)
        engine = engine_stats(tables, meta, end - start)
    p99 = breakdown["ttft"]["p99"]
    shares = p99["shares"]
    scores = {v: sum(shares.get(s, 0.0) for s in segs) for v, segs in _SCORE_SEGMENTS.items()}
    e2el_out = breakdown["e2el"]["p99"]["shares"].get("output_last", 0.0)
    scores["output-bound"] = max(scores["output-bound"], e2el_out)
    ev = _evidence(tables, breakdown, engine)
    if p99["num_requests"] == 0:
        return Diagnosis("nothing-completed", _nothing_completed(tables.requests), scores, ev)
    verdict = max(scores, key=lambda k: scores[k])
    if scores[verdict] < SCORE_THRESHOLD:
        verdict = _saturated_stage(ev)
    text = _paragraph(verdict, shares, scores, ev, e2el_out)
    return Diagnosis(verdict, text, scores, ev)


def _nothing_completed(requests: ColumnTable) -> str:
    """Why no request completed, naming the commonest rejection reasons (e.g. a prompt that
    exceeds max_model_len) so that a run of only failures never looks healthy."""
    text = "No request completed: nothing to diagnose."
    if "rejected_reason" not in requests or not len(requests):
        return text
    rejected = requests.labels("rejected_reason")
    reasons = rejected.strings()[rejected.codes >= 0]
    reasons = reasons[reasons != ""]
    if not len(reasons):
        return text
    # group reasons that differ only in their numbers; show the first of each group
    groups: dict[str, list[Any]] = {}
    for reason in reasons.tolist():
        entry = groups.setdefault(re.sub(r"\d+(\.\d+)?", "#", reason), [reason, 0])
        entry[1] += 1
    ranked = sorted(groups.values(), key=lambda e: -e[1])
    shown = "; ".join(
        f"“{example}”" if n == 1 else f"{n} such as “{example}”" for example, n in ranked[:3]
    )
    more = f"; and {len(ranked) - 3} other kind(s) of rejection" if len(ranked) > 3 else ""
    return (
        f"No request completed: {len(reasons)} of {len(requests)} were rejected — "
        f"{shown}{more}."
    )


def _saturated_stage(ev: Mapping[str, Any]) -> str:
    if ev["kv_full_time_fraction"] >= KV_FULL_TIME and ev["num_preemptions"] > 0:
        return "queue/KV-bound"
    if ev["frontend_utilization"] >= BUSY_THRESHOLD:
        return "front-end-bound"
    out_util = ev["output_processor_utilization"]
    if out_util is not None and out_util >= BUSY_THRESHOLD:
        return "output-bound"
    return "healthy"


def _evidence(
    tables: RunColumns, breakdown: Mapping[str, Any], engine: Mapping[str, Any]
) -> dict[str, Any]:
    keys = (
        "kv_full_time_fraction", "max_kv_usage", "mean_kv_usage", "num_preemptions",
        "mean_num_waiting", "max_num_waiting", "mean_num_running", "frontend_utilization",
        "num_api_servers", "output_processor_utilization", "median_step_time_ms",
        "p99_step_time_ms", "gpu_busy_fraction", "mean_batch_size", "num_replicas",
    )
    ev: dict[str, Any] = {k: engine.get(k) for k in keys}
    req = tables.requests
    ok = req.array("success", bool)
    for path in ("ttft", "e2el"):
        d = describe(req.array(f"{path}_s", np.float64)[ok], (99.0,))
        ev[f"median_{path}_ms"] = d.median * 1000
        ev[f"p99_{path}_ms"] = d.percentiles[0][1] * 1000
    return ev


def _paragraph(
    verdict: str,
    shares: Mapping[str, float],
    scores: Mapping[str, float],
    ev: Mapping[str, Any],
    e2el_out: float,
) -> str:
    """One paragraph: the p99 latency, the evidence for the verdict, what to try."""
    p99 = f"p99 TTFT is {_ms(ev['p99_ttft_ms'])} (median {_ms(ev['median_ttft_ms'])})"
    one = " of one engine" if (ev.get("num_replicas") or 1) > 1 else ""
    waiting = (
        f"up to {ev['max_num_waiting']} requests waited in the scheduler queue{one} "
        f"(time-averaged {ev['mean_num_waiting']:.1f})"
    )
    kv = (
        f"KV usage was ≥ 95% for {_pct(ev['kv_full_time_fraction'])} of the run "
        f"(peak {_pct(ev['max_kv_usage'])}) and {ev['num_preemptions']} preemptions happened"
    )
    n_api = ev["num_api_servers"]
    fe = (
        f"the API server was busy {_pct(ev['frontend_utilization'])} of the run" if n_api == 1
        else f"the {n_api} API servers were each busy {_pct(ev['frontend_utilization'])} of "
        "the run on average"
    )
    steps = (
        f"the median engine step took {ev['median_step_time_ms']:.1f} ms "
        f"(p99 {ev['p99_step_time_ms']:.1f} ms)"
    )
    out_util = ev["output_processor_utilization"]
    out = (
        f"the output processor was busy {_pct(out_util)} of the run"
        if out_util is not None else "the output processor's load is unknown"
    )
    spent = f"{p99}; the p99 requests spent"
    if verdict == "front-end-bound":
        body = (
            f"{spent} {_pct(shares['client_to_frontend'])} of it waiting for an API server "
            f"and {_pct(shares['frontend_cpu'])} in its CPU work (template, tokenize); {fe}, "
            f"while {steps}: the front end is the bottleneck."
        )
    elif verdict == "queue/KV-bound":
        body = (
            f"{spent} {_pct(scores['queue/KV-bound'])} of it in the scheduler's waiting queue "
            f"(KV blocks {_pct(shares['wait_kv_cache'])}, preemption steps "
            f"{_pct(shares['wait_preemption'])}, max_num_seqs "
            f"{_pct(shares['wait_max_num_seqs'])}); {kv}, and {waiting}: the KV cache and "
            "the admission queue are the bottleneck."
        )
    elif verdict == "compute-bound":
        body = (
            f"{spent} {_pct(scores['compute-bound'])} of it waiting for room in the steps' "
            f"token budget and {_pct(shares['prefill'])} in prefill; the GPU "
            f"was busy {_pct(ev['gpu_busy_fraction'])} of the run, {steps}, and {waiting}, "
            f"with no KV pressure ({kv}): the GPU's compute is the bottleneck."
        )
    elif verdict == "output-bound":
        body = (
            f"{spent} {_pct(shares['output_first'])} of it in output processing before the "
            f"first token reached the client (the p99 E2EL requests {_pct(e2el_out)} before "
            f"their last token); {out}, while {steps}: the output path is the bottleneck."
        )
    else:
        body = (
            f"No bottleneck: {spent} {_pct(shares['prefill'])} of it in their own prefill and "
            f"{_pct(sum(scores.values()))} queueing at the front end, the scheduler or the "
            f"output path; {kv}; {waiting}; {fe}; {out}; {steps}."
        )
    return f"{body} Try {_ADVICE[verdict]}."
