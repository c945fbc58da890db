"""Where did the time go: each request's TTFT and E2EL split into consecutive segments (METRICS §3).

The request path, with the stage boundaries the event log records::

    send ─▶ frontend_start ─▶ tokenized ─▶ engine_enqueued ─▶ first scheduled ─▶ first token
    (ARRIVAL)                                                                  (engine) ─▶ …

TTFT = client→front end + front-end CPU + IPC in + scheduler waiting (by reason) + prefill
       + output (first token: output processing + IPC out + network);
E2EL = the same up to prefill, + decode (first → last token in the engine)
       + output (last token).

Scheduler waiting (``engine_enqueued`` → first ``SCHEDULED``) is split by the reason admissions
stopped (``StepRecord.admission_blocker``): the interval between two consecutive
``schedule()`` calls is charged to the blocker of the first one; waiting while nothing blocked
admission (the request arrived after the last ``schedule()``) is ``wait_next_step``.

A stage the log does not have (e.g. no front end in an offline run) collapses to zero and its
time goes to the next segment, so the segments always sum to the latency. The network can only
be told apart from the API-server queue with the client's clock, so they share a segment.

Shares are reported at the median and p99 request: the mean segment times of the requests whose
latency rank lies in a narrow band around that percentile (±2.5 points at the median, ±0.5 at
p99; at least one request), divided by their mean latency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reports.columns import ColumnTable


@dataclass(frozen=True, slots=True)
class Segment:
    """One consecutive piece of the request path."""

    name: str  # column ``seg_{name}_s`` of the requests table
    label: str  # plain words for reports
    group: str  # "front-end", "engine-loop", "queue/KV", "compute" or "output"
    in_ttft: bool  # part of the TTFT path
    in_e2el: bool  # part of the E2EL path


SEGMENTS: tuple[Segment, ...] = (
    Segment("client_to_frontend", "network in + API-server queue", "front-end", True, True),
    Segment("frontend_cpu", "front-end CPU (template, tokenize)", "front-end", True, True),
    Segment("ipc_in", "IPC in + engine-loop pickup", "engine-loop", True, True),
    Segment("wait_token_budget", "waiting: token budget full", "compute", True, True),
    Segment("wait_max_num_seqs", "waiting: max_num_seqs reached", "queue/KV", True, True),
    Segment("wait_kv_cache", "waiting: KV blocks", "queue/KV", True, True),
    Segment("wait_preemption", "waiting: preemption step", "queue/KV", True, True),
    Segment("wait_policy", "waiting: held by the scheduling policy", "queue/KV", True, True),
    Segment("wait_next_step", "waiting: next schedule()", "engine-loop", True, True),
    Segment("prefill", "prefill steps (incl. preempted)", "compute", True, True),
    Segment("decode", "decode steps (incl. preempted)", "compute", False, True),
    Segment("output_first", "output processing + IPC out + network", "output", True, False),
    Segment("output_last", "output processing + IPC out + network", "output", False, True),
)
SEGMENT_BY_NAME: dict[str, Segment] = {s.name: s for s in SEGMENTS}
#: admission_blocker value -> waiting segment
WAIT_REASONS: dict[str, str] = {
    "token_budget": "wait_token_budget",
    "max_num_seqs": "wait_max_num_seqs",
    "kv_cache": "wait_kv_cache",
    "preemption": "wait_preemption",
    "policy": "wait_policy",
}
#: latency column of each path
PATHS: dict[str, str] = {"ttft": "ttft_s", "e2el": "e2el_s"}
#: half width of the rank band (percentile points) around each reported percentile
BAND_HALF_WIDTH: dict[float, float] = {50.0: 2.5, 99.0: 0.5}


def column(name: str) -> str:
    return f"seg_{name}_s"


def path_segments(path: str) -> list[Segment]:
    """The segments of ``path`` ("ttft" or "e2el"), in path order."""
    return [s for s in SEGMENTS if (s.in_ttft if path == "ttft" else s.in_e2el)]


def segment_columns(cols: Mapping[str, Any], steps: ColumnTable) -> dict[str, np.ndarray]:
    """The ``seg_*_s`` columns from a request table's stage-time columns (vectorised)."""
    names = (
        "arrival_s", "frontend_start_s", "tokenized_s", "engine_enqueued_s", "scheduled_s",
        "first_token_s", "last_token_s",
    )
    b = [np.asarray(cols[n], dtype=np.float64) for n in names]
    for i in range(1, len(b)):  # a missing boundary collapses its segment to zero
        b[i] = np.where(np.isnan(b[i]), b[i - 1], b[i])
    arrival, fe_start, tokenized, enqueued, scheduled, first_tok, last_tok = b
    out = {
        column("client_to_frontend"): fe_start - arrival,
        column("frontend_cpu"): tokenized - fe_start,
        column("ipc_in"): enqueued - tokenized,
    }
    replica = cols.get("replica")  # OptionalInts: floats, NaN where unknown
    waits = wait_split(enqueued, scheduled, steps, None if replica is None else replica.values)
    out.update({column(k): v for k, v in waits.items()})
    out[column("prefill")] = first_tok - scheduled
    out[column("decode")] = last_tok - first_tok
    out[column("output_first")] = np.asarray(cols["first_token_delivered_s"]) - first_tok
    out[column("output_last")] = np.asarray(cols["last_token_delivered_s"]) - last_tok
    return {column(s.name): out[column(s.name)] for s in SEGMENTS}


def wait_split(
    enqueued: np.ndarray,
    scheduled: np.ndarray,
    steps: ColumnTable,
    replica: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Each request's waiting interval split by the blocker in force (see module doc).

    With several data-parallel engines (a ``replica`` column in ``steps``), a request is
    charged with the blockers of its own engine (``replica``, NaN: unknown, all steps).
    """
    if replica is None or "replica" not in steps:
        return _wait_split_one(enqueued, scheduled, steps)
    step_replica = steps.array("replica")
    engines = np.unique(step_replica)
    if len(engines) <= 1:
        return _wait_split_one(enqueued, scheduled, steps)
    out = {seg: np.full(len(enqueued), np.nan) for seg in (*WAIT_REASONS.values(),
                                                           "wait_next_step")}
    unknown = np.isnan(replica)
    groups = [(unknown, steps)]
    groups += [(replica == r, steps.take(step_replica == r)) for r in engines]
    for mask, group in groups:
        if mask.any():
            part = _wait_split_one(enqueued[mask], scheduled[mask], group)
            for seg, values in part.items():
                out[seg][mask] = values
    return out


def _wait_split_one(
    enqueued: np.ndarray, scheduled: np.ndarray, steps: ColumnTable
) -> dict[str, np.ndarray]:
    """``wait_split`` against one engine's steps."""
    total = scheduled - enqueued
    out: dict[str, np.ndarray] = {}
    if len(steps) == 0:
        out = {seg: np.zeros_like(total) for seg in WAIT_REASONS.values()}
        out["wait_next_step"] = total
        return out
    t = steps.array("schedule_time_s", np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order]
    # the blockers as category codes (one comparison of small ints per reason, not of strings)
    blocker = steps.labels("admission_blocker")
    codes = blocker.codes[order][:-1]
    dt = np.diff(t)
    charged = np.zeros_like(total)
    for reason, seg in WAIT_REASONS.items():
        code = blocker.code_of(reason)  # -2 if no step has it (-1: missing)
        cum = np.concatenate(([0.0], np.cumsum(np.where(codes == code, dt, 0.0))))
        part = np.interp(scheduled, t, cum) - np.interp(enqueued, t, cum)
        out[seg] = part
        charged = charged + part
    out["wait_next_step"] = np.maximum(total - charged, 0.0)  # no -1e-18 from rounding
    return out


def _band(n: int, q: float) -> tuple[int, int]:
    """Rank range [lo, hi) of the requests around percentile ``q`` of ``n`` sorted values."""
    w = BAND_HALF_WIDTH.get(q, 0.5)
    center = round(q / 100 * (n - 1))
    lo = int(np.floor(max(q - w, 0.0) / 100 * (n - 1)))
    hi = int(np.ceil(min(q + w, 100.0) / 100 * (n - 1)))
    return min(lo, center), max(hi, center) + 1


def breakdown_summary(
    requests: ColumnTable, quantiles: Sequence[float] = (50.0, 99.0)
) -> dict[str, Any]:
    """Segment times (ms) and shares at each quantile and on average, per path.

    Returns ``{"ttft": {"p50": {...}, "p99": {...}, "mean": {...}}, "e2el": {...},
    "labels": {segment: label}}`` where each leaf is ``{"latency_ms", "num_requests",
    "segments_ms": {segment: ms}, "shares": {segment: fraction}}``.
    """
    ok = requests.array("success", bool)
    result: dict[str, Any] = {"labels": {s.name: s.label for s in SEGMENTS}}
    for path, latency_col in PATHS.items():
        segs = path_segments(path)
        lat = requests.array(latency_col, np.float64)[ok]
        order = np.argsort(lat, kind="stable")  # ties: the same requests on every rebuild
        bands = {f"p{_word(q)}": order[slice(*_band(len(lat), float(q)))] if len(lat) else order
                 for q in quantiles}
        # one segment column at a time (a million requests: 8 MB each, not 100 MB at once)
        seg_means: dict[str, list[float]] = {key: [] for key in (*bands, "mean")}
        for s in segs if len(lat) else ():
            c = requests.array(column(s.name), np.float64)[ok]
            for key, rows in bands.items():
                seg_means[key].append(float(c[rows].mean()))
            seg_means["mean"].append(float(c.mean()))
        entry = {key: _leaf(lat[rows], seg_means[key], segs) for key, rows in bands.items()}
        entry["mean"] = _leaf(lat, seg_means["mean"], segs)
        result[path] = entry
    return result


def _word(q: float) -> str:
    return str(int(q)) if int(q) == q else str(q)


def _leaf(lat: np.ndarray, mean_seg: list[float], segs: list[Segment]) -> dict[str, Any]:
    """One leaf from the band's latencies and its mean segment times (s)."""
    if len(lat) == 0:
        zeros = {s.name: 0.0 for s in segs}
        return {"latency_ms": 0.0, "num_requests": 0, "segments_ms": zeros, "shares": zeros}
    mean_lat = float(lat.mean())
    return {
        "latency_ms": mean_lat * 1000,
        "num_requests": len(lat),
        "segments_ms": {s.name: float(v) * 1000 for s, v in zip(segs, mean_seg, strict=True)},
        "shares": {
            s.name: float(v / mean_lat) if mean_lat > 0 else 0.0
            for s, v in zip(segs, mean_seg, strict=True)
        },
    }


def breakdown_records(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The breakdown summary as DataFrame-ready rows: path, at, segment, label, ms, share."""
    rows = []
    for path in PATHS:
        for at, leaf in summary.get(path, {}).items():
            for name, ms in leaf["segments_ms"].items():
                rows.append({
                    "path": path, "at": at, "segment": name,
                    "label": SEGMENT_BY_NAME[name].label, "ms": ms,
                    "share": leaf["shares"][name],
                })
    return rows


def group_shares(leaf: Mapping[str, Any]) -> dict[str, float]:
    """A leaf's shares summed by segment group."""
    out: dict[str, float] = {}
    for name, share in leaf["shares"].items():
        g = SEGMENT_BY_NAME[name].group
        out[g] = out.get(g, 0.0) + share
    return out
