"""Applying a ``BulkRun``: the state changes of ``K`` engine iterations, made at once.

``apply_bulk_run`` changes the scheduler, the requests and the KV cache exactly as ``K``
step-by-step iterations would. Per-request counters are independent across requests and set in
closed form; KV-block operations are not (they share the free queue), so they are collected per
(iteration, phase) in the order the step-by-step scheduler performs them — running order within
a phase, allocation before prefix registration within a request, registration before freeing —
and applied in that order. The scheduler's own state changes through its bulk-run transitions
(``admit_waiting``, ``finish_length_capped``, ``end_bulk_run``); the KV cache's through its
manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from engine.core.bulk.records import AppliedRun
from engine.core.bulk.run import BulkRun
from engine.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.step_output import new_request_data

if TYPE_CHECKING:
    from engine.core.kv_cache_manager import KVCacheManager

# block-event kinds, in flat triples (request index, kind, arg); Final: native when compiled
_ALLOC: Final = 0
_CACHE: Final = 1
_FREE: Final = 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Events:
    """Block events of a run, bucketed by (iteration, phase); phase 0 = schedule, 1 = update."""

    def __init__(self, num_iterations: int) -> None:
        self.buckets: list[list[int] | None] = [None] * (2 * num_iterations)

    def add(self, k: int, phase: int, i: int, kind: int, arg: int) -> None:
        b = self.buckets[2 * k + phase]
        if b is None:
            self.buckets[2 * k + phase] = [i, kind, arg]
        else:
            b.append(i)
            b.append(kind)
            b.append(arg)


def apply_bulk_run(
    sched: Scheduler, run: BulkRun, num_iterations: int, token_id: int
) -> AppliedRun:
    """Apply ``num_iterations`` (1..run.max_iterations) iterations of ``run`` to ``sched``,
    every sampling request sampling ``token_id``. Event records (token runs, first tokens,
    finishes, step records) are the caller's: see ``EngineCore.apply_bulk_run``."""
    k_total = num_iterations
    if not 1 <= k_total <= run.max_iterations or run.ensure_shapes(k_total) < k_total:
        raise ValueError(f"num_iterations must be in [1, {run.max_iterations}]")
    kv = sched.kv_cache_manager
    requests = run.requests
    num_reqs = len(requests)
    x = run.prefill_index
    finished_before = sched.take_finished_req_ids()  # shipped by the run's first schedule()
    # 1. Block events, from the plan and the requests as they are now.
    events = _Events(k_total)
    for i in range(num_reqs):
        num_cached = requests[i].num_cached_blocks
        if i == x:
            num_cached = _prefill_events(run, i, requests[i], k_total, kv, events)
        if k_total > run.decode_start[i]:
            _decode_events(run, i, k_total, num_cached, kv, events)
    # 2. An admission by the first schedule() comes after that schedule's decodes.
    admitted = None
    if run.admitted:
        _apply_bucket(sched, kv, requests, events.buckets[0])
        admitted = _admit(sched, run)
    # 3. Counters and tokens (independent per request), then the remaining block events.
    token_start = [0] * num_reqs
    token_count = [0] * num_reqs
    for i in range(num_reqs):
        req = requests[i]
        if i == x:
            _prefill_counters(run, i, req, k_total, token_start, token_count, token_id)
        if k_total > run.decode_start[i]:
            _decode_counters(run, i, req, k_total, token_start, token_count, token_id)
    free_after = _apply_events(sched, kv, requests, events, k_total, run.admitted)
    finish = run.finish_iteration
    sched.end_bulk_run(
        k_total,
        [r for i, r in enumerate(requests) if finish[i] < k_total],
        {requests[i].req_id for i in run.finishing(k_total - 1)},
        {requests[i].req_id for i in run.scheduled_at(k_total - 1)},
    )
    finish_counts = run.finish_counts(k_total)
    running_after = []
    n_running = num_reqs
    for count in finish_counts:
        n_running -= count
        running_after.append(n_running)
    sampled = run.decoding[:k_total]
    if run.is_async:
        sampled.insert(0, run.pending_num_sampled)
        sampled.pop()
        j = run.prefill_done_iteration + 1  # the prefiller's final chunk, applied one later
    else:
        j = run.prefill_done_iteration
    if j < k_total:
        sampled[j] += 1
    last = None
    if run.is_async:
        if k_total > 1:
            shipped = {requests[i].req_id for i in run.finishing(k_total - 2)}
        else:
            shipped = finished_before
        last = _last_scheduled_output(run, k_total, shipped, kv.block_size, admitted)
    first_applied = run.first_applied_step_id()
    return AppliedRun(
        num_iterations=k_total,
        applied_step_ids=range(first_applied, first_applied + k_total),
        sampled_per_step=sampled,
        finished_per_step=finish_counts,
        num_running_after=running_after,
        free_blocks_after=free_after,
        token_start=token_start,
        token_count=token_count,
        last_scheduled=last,
    )


def _admit(sched: Scheduler, run: BulkRun) -> NewRequestData:
    """The first schedule()'s admission, by the scheduler's own code; it must be the planned
    one (``find._plan_admission``)."""
    request = run.requests[run.prefill_index]
    plan = sched.admit_waiting(run.token_budget - run.decoding[0])
    if (
        plan.scheduled_new != [request]
        or plan.num_scheduled_tokens != {request.req_id: run.admission_chunk}
        or plan.blocker != run.admission_blocker
        or request.num_computed_tokens != run.prefill_context[0]
    ):
        raise AssertionError(f"bulk run: {request.req_id!r} was not admitted as planned")
    return new_request_data(request, plan.new_block_ids[request.req_id])


def _prefill_events(
    run: BulkRun, i: int, req: Request, k_total: int, kv: KVCacheManager, events: _Events
) -> int:
    """The prefiller's block events within the run; returns its registered block count after
    its chunks (an admission's first chunk is the admission's own business)."""
    bs = kv.block_size
    num_known = req.num_tokens
    num_cached = req.num_cached_blocks
    max_hashes = len(req.block_hashes)
    chunks = min(k_total, len(run.prefill_chunk))
    for k in range(chunks):
        c = run.prefill_context[k]
        end = c + run.prefill_chunk[k]
        target = min(min(end, num_known) // bs, max_hashes)
        if k == 0 and run.admitted:  # allocate_slots caches the same full blocks
            num_cached = target
            continue
        num_new = _cdiv(end, bs) - _cdiv(c, bs)
        if num_new:
            events.add(k, 0, i, _ALLOC, num_new)
        if kv.enable_caching and target > num_cached:
            events.add(k, 0, i, _CACHE, target)
            num_cached = target
    if not run.is_async and chunks - 1 == run.prefill_done_iteration == run.finish_iteration[i]:
        events.add(chunks - 1, 1, i, _FREE, 0)  # its first token ends it
    return num_cached


def _prefill_counters(
    run: BulkRun,
    i: int,
    req: Request,
    k_total: int,
    token_start: list[int],
    token_count: list[int],
    token_id: int,
) -> None:
    """The prefiller's counters after its chunks within the run."""
    last = min(k_total, len(run.prefill_chunk)) - 1
    req.num_computed_tokens = run.prefill_context[last] + run.prefill_chunk[last]
    final = last == run.prefill_done_iteration
    req.is_prefill_chunk = not final
    if run.is_async:
        req.num_in_flight_tokens = run.prefill_chunk[last]
        req.num_output_placeholders = 1 if final else 0
    elif final:  # synchronous: the final chunk's token arrives at its own update
        req.append_output_tokens(token_id, 1)
        token_start[i] = last
        token_count[i] = 1


def _decode_events(
    run: BulkRun, i: int, k_total: int, num_cached: int, kv: KVCacheManager, events: _Events
) -> None:
    """Request ``i``'s block events in its decode iterations within the run."""
    bs = kv.block_size
    start = run.decode_start[i]
    c = run.context_at_start[i]
    f = run.finish_iteration[i]
    scheduled = min(k_total, run.decode_end[i]) - start
    k = start + (-c) % bs  # a new block when the context c + k − start hits a boundary
    stop = start + scheduled
    while k < stop:
        events.add(k, 0, i, _ALLOC, 1)
        k += bs
    d = 1 if run.is_async else 0
    if kv.enable_caching and scheduled > 0:
        # schedule() of iteration start+k registers the full blocks of c + k + 1 − d tokens
        # (async: known tokens lag one behind); the count grows at block boundaries only
        target = (c + 1 - d) // bs
        if target > num_cached:
            events.add(start, 0, i, _CACHE, target)
            num_cached = target
        k = (-(c + 1 - d)) % bs or bs
        while k < scheduled:
            target = (c + k + 1 - d) // bs
            if target > num_cached:
                events.add(start + k, 0, i, _CACHE, target)
                num_cached = target
            k += bs
    if start <= f < k_total:  # (a prefiller ended by its first token finished before start)
        if run.is_async and kv.enable_caching:
            # the finishing update caches up to the processed position, then frees
            events.add(f, 1, i, _CACHE, (c + f - start) // bs)
        events.add(f, 1, i, _FREE, 0)


def _decode_counters(
    run: BulkRun,
    i: int,
    req: Request,
    k_total: int,
    token_start: list[int],
    token_count: list[int],
    token_id: int,
) -> None:
    """Request ``i``'s counters after its decode iterations within the run (from its steady
    decode state)."""
    start = run.decode_start[i]
    f = run.finish_iteration[i]
    scheduled = min(k_total, run.decode_end[i]) - start
    tokens = min(k_total, f + 1) - start
    if tokens > 0:
        req.append_output_tokens(token_id, tokens)
        if not token_count[i]:
            token_start[i] = start
        token_count[i] += tokens
    if scheduled > 0:
        req.num_computed_tokens += scheduled
    req.is_prefill_chunk = False
    if run.is_async:
        still = 1 if f >= k_total else 0
        req.num_in_flight_tokens = still
        req.num_output_placeholders = still


def _apply_events(
    sched: Scheduler,
    kv: KVCacheManager,
    requests: list[Request],
    events: _Events,
    k_total: int,
    first_applied: bool,
) -> list[int]:
    """Apply the block events in order (the first bucket already, if ``first_applied``);
    returns the free block count after each iteration."""
    queue = kv.block_pool.free_queue
    free_after: list[int] = []
    buckets = events.buckets
    for k in range(k_total):
        if k or not first_applied:
            _apply_bucket(sched, kv, requests, buckets[2 * k])
        _apply_bucket(sched, kv, requests, buckets[2 * k + 1])
        free_after.append(queue.num_free_blocks)
    return free_after


def _apply_bucket(
    sched: Scheduler, kv: KVCacheManager, requests: list[Request], bucket: list[int] | None
) -> None:
    if bucket is None:
        return
    bs = kv.block_size
    p = 0
    while p < len(bucket):
        req = requests[bucket[p]]
        kind = bucket[p + 1]
        if kind == _ALLOC:
            kv.append_blocks(req, bucket[p + 2])
        elif kind == _CACHE:
            kv.cache_blocks(req, bucket[p + 2] * bs)
        else:
            sched.finish_length_capped(req)
        p += 3


def _last_scheduled_output(
    run: BulkRun,
    k_total: int,
    finished_req_ids: set[str],
    bs: int,
    admitted: NewRequestData | None,
) -> SchedulerOutput:
    """The SchedulerOutput of the run's last schedule() (async: it stays in flight);
    ``admitted``: the request the run's first schedule() admitted, if any."""
    k = k_total - 1
    new_reqs = [admitted] if admitted is not None and k == 0 else []
    ids: list[str] = []
    new_block_ids: list[list[int] | None] = []
    computed: list[int] = []
    num_output: list[int] = []
    num_scheduled: dict[str, int] = {}
    partial: set[str] = set()
    x = run.prefill_index
    for i, req in enumerate(run.requests):
        if i == x and new_reqs:  # a new request: in scheduled_new_reqs
            num_scheduled[req.req_id] = run.prefill_chunk[0]
            if run.prefill_done_iteration != 0:
                partial.add(req.req_id)
            continue
        if i == x and k < len(run.prefill_chunk):
            c, q = run.prefill_context[k], run.prefill_chunk[k]
            blocks = req.block_ids[_cdiv(c, bs): _cdiv(c + q, bs)]
            new_block_ids.append(blocks if blocks else None)
            if k != run.prefill_done_iteration:
                partial.add(req.req_id)
        elif run.decode_start[i] <= k < run.decode_end[i]:
            c = run.context_at_start[i] + k - run.decode_start[i]
            q = 1
            new_block_ids.append([req.block_ids[-1]] if c % bs == 0 else None)
        else:
            continue
        ids.append(req.req_id)
        computed.append(c)
        # known outputs + the placeholder in flight at that schedule() = the count now
        num_output.append(req.num_output_tokens)
        num_scheduled[req.req_id] = q
    cached = CachedRequestData(
        req_ids=ids,
        new_block_ids=new_block_ids,
        num_computed_tokens=computed,
        num_output_tokens=num_output,
    )
    return SchedulerOutput(
        step_id=run.first_step_id + k,
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=run.num_tokens(k),
        partial_prefill_req_ids=partial,
        preempted_req_ids=set(),
        finished_req_ids=finished_req_ids,
        batch_shape=run.batch_shape(k),
        admission_blocker=run.blocker(k),
    )
