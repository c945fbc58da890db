"""Token-level client metrics computed from token runs, without one row per token.

A request's tokens are delivered at ``delivered[s]`` for the steps ``s`` of its token runs.
Inside a run the gaps are ``delivered[s+1] − delivered[s]``, shared by every run that covers
steps ``s`` and ``s+1``: a difference array over steps counts them (one weight per step). Between
two consecutive runs of one request there is one explicit gap. So pooled ITLs are at most
``num_steps + num_runs`` weighted values, whatever the number of tokens.

The per-second peaks (``max_output_tokens_per_s``, ``max_concurrent_requests``) follow
``vllm bench serve``'s ``calculate_metrics``: one-second buckets from the earliest send of a
successful request, a token counted in the bucket of its delivery time, a request counted in
every bucket from its send second to its completion second inclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from reports.tables import RunTables, step_lookup


@dataclass(frozen=True, slots=True)
class PooledITL:
    """All inter-token latencies of the selected requests as (value, count) pairs (seconds)."""

    values: np.ndarray  # float64 gap lengths
    weights: np.ndarray  # int64 number of gaps of that length


def _runs_of(tables: RunTables, mask: np.ndarray | None) -> pd.DataFrame:
    runs = tables.token_runs
    if mask is None:
        return runs
    return runs[mask[runs["req_index"].to_numpy()]]


def pooled_itls(tables: RunTables, mask: np.ndarray | None = None) -> PooledITL:
    """The pooled ITLs of the requests where ``mask`` (per req_index) is True (all if None)."""
    runs = _runs_of(tables, mask)
    delivered = step_lookup(tables.steps, "delivered_time_s")
    req = runs["req_index"].to_numpy()
    first = runs["first_step"].to_numpy()
    count = runs["num_tokens"].to_numpy()
    size = len(delivered)
    # inside runs: gap (s, s+1) for s in [first, first + count - 2]
    multi = count >= 2
    diff = np.bincount(first[multi], minlength=size + 1)[: size + 1].astype(np.int64)
    diff -= np.bincount(first[multi] + count[multi] - 1, minlength=size + 1)[: size + 1]
    within_w = np.cumsum(diff)[: max(size - 1, 0)]
    steps_with = np.flatnonzero(within_w)
    within_v = delivered[steps_with + 1] - delivered[steps_with]
    # between consecutive runs of one request (runs are sorted by req_index, first_step)
    same = req[1:] == req[:-1]
    last_prev = (first + count - 1)[:-1][same]
    first_next = first[1:][same]
    between_v = delivered[first_next] - delivered[last_prev]
    values = np.concatenate([within_v, between_v])
    weights = np.concatenate([within_w[steps_with], np.ones(len(between_v), dtype=np.int64)])
    return PooledITL(values, weights)


def per_request_itls(tables: RunTables, mask: np.ndarray) -> list[list[float]]:
    """vllm bench's ``itls`` detail: one list of gaps (s) per request where ``mask`` is True.

    Expands every token, so it is only computed on request (``detailed=True``).
    """
    runs = _runs_of(tables, mask)
    delivered = step_lookup(tables.steps, "delivered_time_s")
    count = runs["num_tokens"].to_numpy()
    req = np.repeat(runs["req_index"].to_numpy(), count)
    starts = np.repeat(runs["first_step"].to_numpy(), count)
    offsets = np.arange(len(req)) - np.repeat(np.cumsum(count) - count, count)
    times = delivered[starts + offsets]
    gaps = np.diff(times)
    same = req[1:] == req[:-1]
    selected = np.flatnonzero(mask)
    per_req_gaps = np.bincount(req[1:][same], minlength=len(mask))
    bounds = np.cumsum(per_req_gaps[selected])
    kept = gaps[same]
    return [chunk.tolist() for chunk in np.split(kept, bounds[:-1])] if len(selected) else []


def per_second_peaks(tables: RunTables, mask: np.ndarray) -> tuple[float, int]:
    """(max_output_tokens_per_s, max_concurrent_requests) as vllm bench computes them."""
    req = tables.requests
    if not mask.any():
        return 0.0, 0
    start = req["arrival_s"].to_numpy()[mask]
    end = req["last_token_delivered_s"].to_numpy()[mask]
    t0 = float(start.min())
    num_buckets = np.ceil(float(end.max()) - t0) + 1  # seconds the run spans (a float: a
    # trace stretched by a tiny rate may span more seconds than an array could hold, so
    # both peaks are computed over the occupied seconds only)
    # tokens: per step, the number of selected requests that got a token in it
    runs = tables.token_runs
    selected = mask[runs["req_index"].to_numpy()]  # the selected requests' runs (no table copy)
    delivered = step_lookup(tables.steps, "delivered_time_s")
    first = runs["first_step"].to_numpy()[selected]
    stop = first + runs["num_tokens"].to_numpy()[selected]
    del selected
    cover = np.bincount(first, minlength=len(delivered) + 1).astype(np.int64)
    cover -= np.bincount(stop, minlength=len(delivered) + 1)
    tokens_per_step = np.cumsum(cover)[: len(delivered)]
    has = tokens_per_step > 0
    bucket = np.trunc(delivered[has] - t0)
    ok = (bucket >= 0) & (bucket < num_buckets)
    _, slot = np.unique(bucket[ok], return_inverse=True)
    tokens = np.bincount(slot, weights=tokens_per_step[has][ok])
    # concurrency: +1 in every second from the send second to the completion second, i.e. +1
    # at the send second and -1 one second after the completion second. The count only falls
    # between send seconds, so its peak is at one: the sends up to it minus the ends before.
    sends = np.sort(np.trunc(start - t0))
    ends = np.sort(np.trunc(end - t0) + 1)
    conc = np.searchsorted(sends, sends, side="right") - np.searchsorted(ends, sends,
                                                                          side="right")
    peak_tokens = float(tokens.max()) if len(tokens) else 0.0
    return peak_tokens, int(conc.max())
