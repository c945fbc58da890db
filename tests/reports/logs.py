"""Hand-built event logs with known answers, and a per-token reference of vllm bench's metrics.

``known_log()`` is the log every metric test starts from (times in seconds)::

    steps 0..5: schedule 1.0+s, update 1.5+s, delivered 1.6+s; blockers kv_cache, token_budget,
                then "" (queue drained)
    a: sent 0.0, 10 prompt tokens, enqueued 0.5, scheduled at step 1 (4 cached tokens),
       tokens in steps 1, 2, 3                -> TTFT 2.6, E2EL 4.6, ITLs [1, 1], TPOT 1.0
    b: sent 1.0, 20 prompt tokens, enqueued 1.3, scheduled at step 2, one token in step 2
                                               -> TTFT = E2EL = 2.6, no TPOT, no ITL
    c: sent 0.5, 30 prompt tokens, enqueued 0.6, scheduled at step 0 (16 cached), tokens in
       steps 0, 1, preempted at 3.0, resumed at step 3 (recompute), tokens in steps 4, 5
                                               -> TTFT 1.1, E2EL 6.1, ITLs [1, 3, 1], TPOT 5/3
    d: sent 2.0, rejected at 2.0 (prompt too long)          -> failed

Events are recorded out of time order on purpose (the log keeps call order).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from engine.core.events import EventKind, EventLog, StepRecord

K = EventKind


def step_record(step_id: int, **values: Any) -> StepRecord:
    """A StepRecord with zero/empty defaults for every field not given."""
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(StepRecord):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        defaults[f.name] = 0.0 if kind == "float" else "" if kind == "str" else 0
    defaults.update(step_id=step_id, **values)
    return StepRecord(**defaults)


def add_steps(log: EventLog, num_steps: int, blockers: dict[int, str] | None = None,
              delivered: dict[int, float] | None = None, no_output: tuple[int, ...] = ()) -> None:
    """Steps 0..num_steps-1: schedule 1.0+s, update 1.5+s, delivered 1.6+s (or as given)."""
    blockers = blockers or {}
    delivered = delivered or {}
    for s in reversed(range(num_steps)):  # rows out of step order on purpose
        log.record_step(step_record(
            s, schedule_time_s=1.0 + s, execute_start_s=1.0 + s, execute_end_s=1.5 + s,
            update_time_s=1.5 + s, num_reqs=2, num_tokens=2, num_running=2,
            kv_usage=0.5, admission_blocker=blockers.get(s, ""), cost_s=0.5,
        ))
        if s not in no_output:
            log.record_delivery(s, delivered.get(s, 1.6 + s))


def known_log() -> EventLog:
    """The log of the module docstring."""
    log = EventLog()
    rec = log.record
    # a
    rec("a", K.ARRIVAL, 0.0, 10)
    rec("c", K.ARRIVAL, 0.5, 30)  # out of time order
    rec("a", K.FRONTEND_START, 0.1)
    rec("a", K.TOKENIZED, 0.2)
    rec("a", K.ENGINE_ENQUEUED, 0.5)
    rec("b", K.ARRIVAL, 1.0, 20)
    rec("b", K.FRONTEND_START, 1.0)
    rec("b", K.TOKENIZED, 1.2)
    rec("b", K.ENGINE_ENQUEUED, 1.3)
    rec("c", K.FRONTEND_START, 0.5)
    rec("c", K.TOKENIZED, 0.55)
    rec("c", K.ENGINE_ENQUEUED, 0.6)
    rec("d", K.ARRIVAL, 2.0, 5000)
    rec("d", K.REJECTED, 2.0, "prompt too long")
    # engine: c first, then a, then b
    rec("c", K.SCHEDULED, 1.0, 16)
    rec("c", K.FIRST_TOKEN, 1.5)
    log.record_token("c", 0)
    rec("a", K.SCHEDULED, 2.0, 4)
    log.record_token("c", 1)
    log.record_token("a", 1)
    rec("a", K.FIRST_TOKEN, 2.5)
    rec("b", K.SCHEDULED, 3.0, 0)
    rec("b", K.FIRST_TOKEN, 3.5)
    log.record_token("a", 2)
    log.record_token("b", 2)
    rec("b", K.FINISHED, 3.5, "length")
    log.close_request("b")
    rec("b", K.DELIVERED, 3.6)
    rec("c", K.PREEMPTED, 3.0)
    log.record_token("a", 3)
    rec("a", K.FINISHED, 4.5, "stop")
    log.close_request("a")
    rec("a", K.DELIVERED, 4.6)
    rec("c", K.SCHEDULED, 4.0, 32)
    log.record_token("c", 4)
    log.record_token("c", 5)
    rec("c", K.FINISHED, 6.5, "length")
    log.close_request("c")
    rec("c", K.DELIVERED, 6.6)
    add_steps(log, 6, blockers={0: "kv_cache", 1: "token_budget"})
    return log


# -- a per-token reference of vllm bench's calculate_metrics ------------------------------------
@dataclasses.dataclass
class RefOutput:
    """vllm's RequestFuncOutput fields that calculate_metrics reads."""

    success: bool
    prompt_len: int
    output_tokens: int
    ttft: float
    latency: float
    itl: list[float]
    start_time: float


def reference_outputs(log: EventLog) -> list[RefOutput]:
    """One RefOutput per request, by expanding every token (slow; small logs only)."""
    delivered = log.delivered_times()
    runs = log.token_runs()
    steps_of: dict[int, list[int]] = {}
    for r, f, c in zip(runs["req_index"], runs["first_step"], runs["num_tokens"], strict=True):
        steps_of.setdefault(r, []).extend(range(f, f + c))
    ev = log.events_columns()
    first: dict[tuple[int, int], tuple[float, Any]] = {}
    for r, k, t, p in zip(ev["req_index"], ev["kind"], ev["time_s"], ev["payload"], strict=True):
        if (r, k) not in first or t < first[(r, k)][0]:
            first[(r, k)] = (t, p)
    out = []
    for r in range(len(log.req_ids)):
        start, prompt = first[(r, K.ARRIVAL)]
        finish = first.get((r, K.FINISHED))
        times = [delivered[s] for s in sorted(steps_of.get(r, []))]
        ok = (finish is not None and finish[1] in ("stop", "length") and bool(times)
              and (r, K.REJECTED) not in first)
        out.append(RefOutput(
            success=ok, prompt_len=prompt, output_tokens=len(times),
            ttft=times[0] - start if ok else 0.0, latency=times[-1] - start if ok else 0.0,
            itl=list(np.diff(times)) if ok else [], start_time=start,
        ))
    return out


def reference_metrics(
    outputs: list[RefOutput], dur_s: float, percentiles: list[float], goodput: dict[str, float]
) -> dict[str, Any]:
    """vllm 0.33.0's calculate_metrics, transcribed (lists, loops, np.percentile)."""
    itls: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    ttfts: list[float] = []
    e2els: list[float] = []
    total_input = completed = good = 0
    lens = []
    for o in outputs:
        if not o.success:
            lens.append(0)
            continue
        lens.append(o.output_tokens)
        total_input += o.prompt_len
        tpot = 0.0
        if o.output_tokens > 1:
            tpot = (o.latency - o.ttft) / (o.output_tokens - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += o.itl
        ttfts.append(o.ttft)
        e2els.append(o.latency)
        completed += 1
    if goodput:
        valid, slos = [], []
        for name, values in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els)):
            if name in goodput:
                valid.append(values)
                slos.append(goodput[name] / 1000)
        for req in zip(*valid, strict=True):
            if all(s >= r for s, r in zip(slos, req, strict=True)):
                good += 1
    res: dict[str, Any] = {
        "completed": completed, "total_input_tokens": total_input,
        "total_output_tokens": sum(lens), "request_throughput": completed / dur_s,
        "request_goodput": good / dur_s, "output_throughput": sum(lens) / dur_s,
        "total_token_throughput": (total_input + sum(lens)) / dur_s,
    }
    for key, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        res[f"mean_{key}_ms"] = np.mean(values or 0) * 1000
        res[f"median_{key}_ms"] = np.median(values or 0) * 1000
        res[f"std_{key}_ms"] = np.std(values or 0) * 1000
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            res[f"p{word}_{key}_ms"] = np.percentile(values or 0, p) * 1000
    res.update(_reference_peaks(outputs))
    return res


def _reference_peaks(outputs: list[RefOutput]) -> dict[str, Any]:
    """vllm's per-second token and concurrency buckets, transcribed."""
    ok = [o for o in outputs if o.success]
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = min(o.start_time for o in ok)
    end = max(o.start_time + o.latency for o in ok)
    n = int(np.ceil(end - t0)) + 1
    tokens = np.zeros(n)
    conc = np.zeros(n)
    for o in ok:
        times = [o.start_time + o.ttft]
        cur = times[0]
        for gap in o.itl:
            cur += gap
            times.append(cur)
        for t in times:
            b = int(t - t0)
            if 0 <= b < n:
                tokens[b] += 1
        for sec in range(int(o.start_time - t0), int(o.start_time + o.latency - t0) + 1):
            conc[sec] += 1
    return {"max_output_tokens_per_s": float(tokens.max()),
            "max_concurrent_requests": int(conc.max())}
