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
from typing import TYPE_CHECKING

import numpy as np

from reports.columns import ColumnTable, RunColumns, as_columns
from reports.tables import step_lookup

if TYPE_CHECKING:
    from reports.tables import RunTables


@dataclass(frozen=True, slots=True)
class PooledITL:
    """All inter-token latencies of the selected requests as (value, count) pairs (seconds)."""

    values: np.ndarray  # float64 gap lengths
    weights: np.ndarray  # int64 number of gaps of that length


def _runs_of(tables: RunColumns, mask: np.ndarray | None) -> ColumnTable:
    runs = tables.token_runs
    if mask is None:
        return runs
    return runs.take(mask[runs.array("req_index")])


def pooled_itls(tables: RunTables | RunColumns, mask: np.ndarray | None = None) -> PooledITL:
    """The pooled ITLs of the requests where ``mask`` (per req_index) is True (all if None)."""
    tables = as_columns(tables)
    runs = _runs_of(tables, mask)
    delivered = step_lookup(tables.steps, "delivered_time_s")
    req = runs.array("req_index")
    first = runs.array("first_step")
    count = runs.array("num_tokens")
    size = len(delivered)
    # inside runs: gap (s, s+1) for s in [first, first + count - 2] (temporaries are let go
    # as soon as they are used: a million-request run's report peaks here)
    multi = count >= 2
    first_m, count_m = first[multi], count[multi]
    del multi
    diff = np.asarray(np.bincount(first_m, minlength=size + 1)[: size + 1], dtype=np.int64)
    diff -= np.bincount(first_m + count_m - 1, minlength=size + 1)[: size + 1]
    del first_m, count_m
    np.cumsum(diff, out=diff)
    within_w = diff[: max(size - 1, 0)]
    steps_with = np.flatnonzero(within_w)
    within_v = delivered[1:][steps_with] - delivered[steps_with]
    within_w = within_w[steps_with]
    del diff, steps_with
    # between consecutive runs of one request (runs are sorted by req_index, first_step)
    same = req[1:] == req[:-1]
    last_prev = (first + count - 1)[:-1][same]
    first_next = first[1:][same]
    del same
    between_v = delivered[first_next] - delivered[last_prev]
    del first_next, last_prev, delivered
    values = np.concatenate([within_v, between_v])
    del within_v
    weights = np.concatenate([within_w, np.ones(len(between_v), dtype=np.int64)])
    return PooledITL(values, weights)


def per_request_itls(tables: RunTables | RunColumns, mask: np.ndarray) -> list[list[float]]:
    """vllm bench's ``itls`` detail: one list of gaps (s) per request where ``mask`` is True.

    Expands every token, so it is only computed on request (``detailed=True``).
    """
    tables = as_columns(tables)
    runs = _runs_of(tables, mask)
    delivered = step_lookup(tables.steps, "delivered_time_s")
    count = runs.array("num_tokens")
    req = np.repeat(runs.array("req_index"), count)
    starts = np.repeat(runs.array("first_step"), count)
    offsets = np.arange(len(req)) - np.repeat(np.cumsum(count) - count, count)
    times = delivered[starts + offsets]
    gaps = np.diff(times)
    same = req[1:] == req[:-1]
    selected = np.flatnonzero(mask)
    per_req_gaps = np.bincount(req[1:][same], minlength=len(mask))
    bounds = np.cumsum(per_req_gaps[selected])
    kept = gaps[same]
    return [chunk.tolist() for chunk in np.split(kept, bounds[:-1])] if len(selected) else []


def per_second_peaks(tables: RunTables | RunColumns, mask: np.ndarray) -> tuple[float, int]:
    """(max_output_tokens_per_s, max_concurrent_requests) as vllm bench computes them."""
    tables = as_columns(tables)
    req = tables.requests
    if not mask.any():
        return 0.0, 0
    start = req.array("arrival_s")[mask]
    end = req.array("last_token_delivered_s")[mask]
    t0 = float(start.min())
    num_buckets = np.ceil(float(end.max()) - t0) + 1  # seconds the run spans (a float: a
    # trace stretched by a tiny rate may span more seconds than an array could hold, so
    # both peaks are computed over the occupied seconds only)
    # tokens: per step, the number of selected requests that got a token in it
    runs = tables.token_runs
    selected = mask[runs.array("req_index")]  # the selected requests' runs (no table copy)
    delivered = step_lookup(tables.steps, "delivered_time_s")
    num_steps = len(delivered)
    first = runs.array("first_step")[selected]
    stop = first + runs.array("num_tokens")[selected]
    del selected
    cover = np.bincount(first, minlength=num_steps + 1).astype(np.int64)
    del first
    cover -= np.bincount(stop, minlength=num_steps + 1)
    del stop
    np.cumsum(cover, out=cover)  # tokens delivered per step (the last entry is past the end)
    has = cover[:num_steps] > 0
    weights = cover[:num_steps][has]
    del cover
    bucket = np.trunc(delivered[has] - t0)
    del delivered, has
    ok = (bucket >= 0) & (bucket < num_buckets)
    bucket, weights = bucket[ok], weights[ok]
    del ok
    if num_buckets <= num_steps + 1:  # dense seconds: no larger than the per-step arrays
        tokens = np.bincount(bucket.astype(np.int64), weights=weights)
    else:  # far more seconds than steps (a stretched trace): number the occupied ones
        _, slot = np.unique(bucket, return_inverse=True)
        tokens = np.bincount(slot, weights=weights)
    del bucket, weights
    # concurrency: +1 in every second from the send second to the completion second, i.e. +1
    # at the send second and -1 one second after the completion second. The count only falls
    # between send seconds, so its peak is at one: the sends up to it minus the ends before.
    sends = np.sort(np.trunc(start - t0))
    ends = np.sort(np.trunc(end - t0) + 1)
    conc = np.searchsorted(sends, sends, side="right") - np.searchsorted(ends, sends,
                                                                          side="right")
    peak_tokens = float(tokens.max()) if len(tokens) else 0.0
    return peak_tokens, int(conc.max())
