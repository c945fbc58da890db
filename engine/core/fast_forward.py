"""Exact bulk application of pure-decode steps ("uniform decode runs").

When every running request is decoding one token per step, nothing waiting can be admitted and
KV blocks cannot run out, consecutive engine steps follow a fixed pattern: each running request
gets one token per step until it reaches its length limit and finishes. This module recognises
such a state and applies ``K`` engine iterations at once with *exactly* the state changes ``K``
calls of ``begin_step``/``finish_step`` would make — the same tokens, counters, finishes, block
tables, block ids (popped from the free queue in the same order), frees, prefix-hash
registrations (same order) — in time O(R + K + K·R/B) instead of O(K·R).
``tests/core/test_fast_forward.py`` checks the equality on random states.

One iteration is vLLM's engine loop body: ``schedule(S+k)`` then the update of the oldest batch
— step ``S+k`` itself when synchronous, step ``S+k−1`` under async scheduling (one batch stays
in flight, so updates lag one step, prefix caching lags one token, and a request whose last
token is in flight is skipped by ``schedule()``, finishing at that iteration's update).

Request ``i`` with ``n`` outputs, ``t`` known tokens, ``max_tokens`` M finishes at the update of
iteration ``f_i = min(M − n, max_model_len − t) − 1``; synchronous runs schedule it in
iterations ``0..f_i``, async runs in ``0..f_i−1``. A run never goes past the first finish while
requests wait (a freed seat could admit one), nor past the last scheduled request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.outputs import (
    AdmissionBlocker,
    BatchShape,
    CachedRequestData,
    SchedulerOutput,
)
from engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from engine.core.engine_core import EngineCore
    from engine.core.scheduler import Scheduler

_ALLOC, _CACHE, _FREE = 0, 1, 2  # event kinds, in their order within one (iteration, phase)
_SCHEDULE, _UPDATE = 0, 1  # phases of an iteration


@dataclass(slots=True)
class IterationShape:
    """What one iteration of a run schedules, and who finishes at its update."""

    num_scheduled: int  # requests scheduled (one decode token each)
    context_sum: int  # Σ num_computed_tokens of the scheduled requests, before the step
    context_max: int  # max of those
    finishing: tuple[str, ...]  # requests finishing at this iteration's update
    blocker: AdmissionBlocker  # why this schedule() admits nobody (NONE: nobody waits)

    # Written-out __init__s: compiled by mypyc (see engine/core/outputs.py's docstring).
    def __init__(
        self,
        num_scheduled: int,
        context_sum: int,
        context_max: int,
        finishing: tuple[str, ...],
        blocker: AdmissionBlocker,
    ) -> None:
        self.num_scheduled = num_scheduled
        self.context_sum = context_sum
        self.context_max = context_max
        self.finishing = finishing
        self.blocker = blocker


@dataclass(frozen=True, slots=True)
class UniformDecodeRun:
    """A state from which up to ``max_iterations`` decode iterations can be bulk-applied."""

    requests: tuple[Request, ...]  # running requests, in running order
    finish_iteration: tuple[int, ...]  # per request: the iteration whose update finishes it
    max_iterations: int  # most iterations that stay bulk-applicable
    first_step_id: int  # step id of the first schedule() of the run
    num_waiting: int  # requests waiting throughout (admissions stay blocked)
    token_budget: int
    max_num_seqs: int
    is_async: bool

    def __init__(
        self,
        requests: tuple[Request, ...],
        finish_iteration: tuple[int, ...],
        max_iterations: int,
        first_step_id: int,
        num_waiting: int,
        token_budget: int,
        max_num_seqs: int,
        is_async: bool,
    ) -> None:
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "finish_iteration", finish_iteration)
        object.__setattr__(self, "max_iterations", max_iterations)
        object.__setattr__(self, "first_step_id", first_step_id)
        object.__setattr__(self, "num_waiting", num_waiting)
        object.__setattr__(self, "token_budget", token_budget)
        object.__setattr__(self, "max_num_seqs", max_num_seqs)
        object.__setattr__(self, "is_async", is_async)

    @property
    def num_reqs(self) -> int:
        return len(self.requests)

    def first_applied_step_id(self) -> int:
        """Step whose output the first iteration applies (one step earlier under async)."""
        return self.first_step_id - 1 if self.is_async else self.first_step_id

    def scheduled_iterations(self, i: int) -> int:
        """Number of iterations (from 0) in which request ``i`` is scheduled."""
        return self.finish_iteration[i] + (0 if self.is_async else 1)

    def iteration_shapes(self) -> Iterator[IterationShape]:
        """The shape of iterations 0, 1, …, max_iterations−1 (computed incrementally)."""
        ends: dict[int, list[int]] = {}  # first iteration a request is no longer scheduled
        finishes: dict[int, list[str]] = {}
        for i, req in enumerate(self.requests):
            ends.setdefault(self.scheduled_iterations(i), []).append(req.num_computed_tokens)
            finishes.setdefault(self.finish_iteration[i], []).append(req.req_id)
        active = sorted(r.num_computed_tokens for r in self.requests)
        n = len(active)
        csum = sum(active)
        cmax = active[-1] if active else 0
        running = n  # running at this iteration's schedule (finishes leave at updates)
        for k in range(self.max_iterations):
            gone = ends.get(k)
            if gone:
                n -= len(gone)
                csum -= sum(gone)
                for c in gone:
                    active.remove(c)
                cmax = active[-1] if active else 0
            finishing = tuple(finishes.get(k, ()))
            yield IterationShape(
                n, csum + n * k, cmax + k if n else 0, finishing, self._blocker(n, running)
            )
            running -= len(finishing)

    def _blocker(self, num_scheduled: int, num_running: int) -> AdmissionBlocker:
        """Scheduler._schedule_waiting's verdict for a step that scheduled ``num_scheduled``
        decodes with ``num_running`` running requests (NONE: nobody waits or one could be
        admitted — the latter never happens inside a run)."""
        if not self.num_waiting:
            return AdmissionBlocker.NONE
        if self.token_budget - num_scheduled <= 0:
            return AdmissionBlocker.TOKEN_BUDGET
        if num_running >= self.max_num_seqs:
            return AdmissionBlocker.MAX_NUM_SEQS
        return AdmissionBlocker.NONE


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def find_uniform_decode_run(core: EngineCore, token_id: int) -> UniformDecodeRun | None:
    """The uniform decode run available now (before ``begin_step``), or None.

    ``token_id`` is the token every request will sample (the simulator's placeholder); it must
    not be an EOS or stop token of any running request.
    """
    sched = core.scheduler
    running = sched.running
    if not running or sched.preempted_req_ids:
        return None
    is_async = core.batch_queue_size == 2
    in_flight: dict[str, int] = {}
    if is_async:
        # The batch in flight must hold every running request, each completing its prefill
        # or decoding (a final prefill chunk is fine: its request decodes from now on).
        if core.num_in_flight != 1:
            return None
        pending = core.oldest_in_flight()
        if pending.partial_prefill_req_ids or len(pending.num_scheduled_tokens) != len(running):
            return None
        in_flight = pending.num_scheduled_tokens
        for req, req_id in zip(running, in_flight, strict=True):
            if req.req_id != req_id:
                return None
    elif core.num_in_flight:
        return None
    num_reqs = len(running)
    if num_reqs > sched.token_budget:
        return None
    num_waiting = len(sched.waiting)
    if num_waiting and num_reqs < sched.token_budget and num_reqs < sched.max_num_seqs:
        return None  # the next schedule() may admit (the same checks as _schedule_waiting)
    bs = sched.block_size
    max_model_len = sched.max_model_len
    expected_ph = 1 if is_async else 0
    lag = 0 if is_async else 1  # num_tokens - num_computed_tokens in the steady state
    finish: list[int] = []
    for req in running:
        c = req.num_computed_tokens
        if (
            req.num_output_placeholders != expected_ph
            or req.num_in_flight_tokens != (in_flight[req.req_id] if is_async else 0)
            or req.num_stale_output_tokens
            or req.num_tokens - c != lag
            or len(req.block_ids) != _cdiv(c, bs)
            or token_id == req.eos_token_id
            or token_id in req.stop_token_ids
        ):
            return None
        finish.append(
            min(req.max_tokens - len(req.output_token_ids), max_model_len - req.num_tokens) - 1
        )
    if num_waiting:
        max_iter = min(finish) + 1  # a finish frees a seat: the next schedule may admit
        if is_async and num_reqs - finish.count(min(finish)) < sched.token_budget and (
            num_reqs < sched.max_num_seqs
        ):
            max_iter -= 1  # the async skip of the finishing request leaves budget to admit
    else:
        max_iter = max(finish) + (0 if is_async else 1)  # every iteration schedules someone
    max_iter = _limit_by_free_blocks(
        running, finish, is_async, max_iter, bs, sched.kv_cache_manager.get_num_free_blocks()
    )
    if max_iter < 1:
        return None
    return UniformDecodeRun(
        requests=tuple(running),
        finish_iteration=tuple(finish),
        max_iterations=max_iter,
        first_step_id=sched.first_step_id + sched.num_steps,
        num_waiting=num_waiting,
        token_budget=sched.token_budget,
        max_num_seqs=sched.max_num_seqs,
        is_async=is_async,
    )


def _num_allocs(
    requests: list[Request], finish: list[int], is_async: bool, iterations: int, bs: int
) -> int:
    d = 0 if is_async else 1
    total = 0
    for req, f in zip(requests, finish, strict=True):
        c = req.num_computed_tokens
        total += _cdiv(c + min(iterations, f + d), bs) - _cdiv(c, bs)
    return total


def _limit_by_free_blocks(
    requests: list[Request], finish: list[int], is_async: bool, max_iter: int, bs: int, free: int
) -> int:
    """Largest K <= max_iter whose block allocations all fit in ``free`` blocks (frees of
    finishing requests during the run are not counted: conservative)."""
    if max_iter < 1 or _num_allocs(requests, finish, is_async, max_iter, bs) <= free:
        return max_iter
    lo, hi = 0, max_iter  # allocs(lo) fits, allocs(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _num_allocs(requests, finish, is_async, mid, bs) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class AppliedRun:
    """What ``apply_uniform_decode`` did, for the driver's records."""

    num_iterations: int
    applied_step_ids: range  # steps whose outputs were applied, in order
    shapes: list[IterationShape]  # of the iterations' schedules
    sampled_per_step: list[int]  # tokens each applied step produced
    finished_per_step: list[tuple[str, ...]]  # requests each applied step finished
    num_running_after: list[int]  # running requests after each update
    free_blocks_after: list[int]  # free blocks after each update
    last_scheduled: SchedulerOutput | None  # async: the batch left in flight

    def __init__(
        self,
        num_iterations: int,
        applied_step_ids: range,
        shapes: list[IterationShape],
        sampled_per_step: list[int],
        finished_per_step: list[tuple[str, ...]],
        num_running_after: list[int],
        free_blocks_after: list[int],
        last_scheduled: SchedulerOutput | None,
    ) -> None:
        object.__setattr__(self, "num_iterations", num_iterations)
        object.__setattr__(self, "applied_step_ids", applied_step_ids)
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "sampled_per_step", sampled_per_step)
        object.__setattr__(self, "finished_per_step", finished_per_step)
        object.__setattr__(self, "num_running_after", num_running_after)
        object.__setattr__(self, "free_blocks_after", free_blocks_after)
        object.__setattr__(self, "last_scheduled", last_scheduled)


def apply_uniform_decode(
    core: EngineCore,
    run: UniformDecodeRun,
    num_iterations: int,
    token_id: int,
    shapes: Sequence[IterationShape] | None = None,
) -> AppliedRun:
    """Apply ``num_iterations`` (1..run.max_iterations) iterations of ``run`` to the scheduler.

    ``shapes``, when the caller already walked ``run.iteration_shapes()``, are its first
    ``num_iterations`` (or more) items, reused instead of computed again.
    Event records (token runs, first tokens, finishes, step records) are the caller's: see
    ``EngineCore.apply_uniform_decode``.
    """
    if not 1 <= num_iterations <= run.max_iterations:
        raise ValueError(f"num_iterations must be in [1, {run.max_iterations}]")
    if shapes is not None and len(shapes) < num_iterations:
        raise ValueError(f"{len(shapes)} shapes given for {num_iterations} iterations")
    sched = core.scheduler
    kv = sched.kv_cache_manager
    bs = sched.block_size
    k_total = num_iterations
    d = 1 if run.is_async else 0
    requests = run.requests
    starts = [r.num_computed_tokens for r in requests]
    shapes = (
        list(_take(run.iteration_shapes(), k_total)) if shapes is None else list(shapes[:k_total])
    )
    finished_before = set(sched.finished_req_ids)  # shipped by the run's first schedule()
    # 1. Per-request tokens, counters and hashes (independent across requests).
    events: list[tuple[int, int, int, int, int]] = []  # (iteration, phase, request, kind, arg)
    caching = kv.enable_caching
    for i, req in enumerate(requests):
        c, f = starts[i], run.finish_iteration[i]
        scheduled = min(k_total, run.scheduled_iterations(i))
        appended = min(k_total, f + 1)
        req.output_token_ids.extend([token_id] * appended)
        all_ids = req._all_token_ids
        if all_ids is not None:
            all_ids.extend([token_id] * appended)
        req.num_tokens += appended
        req.num_computed_tokens += scheduled
        req.is_prefill_chunk = False
        if run.is_async:
            req.num_in_flight_tokens = 1 if f >= k_total else 0
            req.num_output_placeholders = 1 if f >= k_total else 0
        if req.block_hasher is not None:
            req.block_hasher.extend(req)
        # 2. Block events, to be applied in the step-by-step scheduler's exact order.
        for k in range((-c) % bs, scheduled, bs):  # a new block when c + k hits a boundary
            events.append((k, _SCHEDULE, i, _ALLOC, 0))
        if caching:
            _cache_events(events, i, c, req.num_cached_blocks, scheduled, bs, d)
        if f < k_total:
            if run.is_async and caching:
                # the finishing update caches up to the processed position, then frees
                events.append((f, _UPDATE, i, _CACHE, (c + f) // bs))
            events.append((f, _UPDATE, i, _FREE, 0))
    events.sort()
    pool = kv.block_pool
    free_after: list[int] = []
    finished: list[tuple[str, ...]] = []
    it = 0
    num_free = pool.get_num_free_blocks()
    for k, _phase, i, kind, arg in events:
        while it < k:  # iterations that had no more events: record their end state
            free_after.append(num_free)
            it += 1
        req = requests[i]
        if kind == _ALLOC:
            req.block_ids.extend(pool.get_new_blocks(1))
        elif kind == _CACHE:
            kv.cache_blocks(req, arg * bs)
        else:
            _finish(sched, req)
        num_free = pool.get_num_free_blocks()
    while it < k_total:
        free_after.append(num_free)
        it += 1
    # 3. Scheduler bookkeeping, as after the last iteration.
    gone = {r.req_id for i, r in enumerate(requests) if run.finish_iteration[i] < k_total}
    if gone:
        sched.running = [r for r in sched.running if r.req_id not in gone]
    for shape in shapes:
        finished.append(shape.finishing)
    sched.num_steps += k_total
    sched.finished_req_ids = set(shapes[-1].finishing)
    sched.prev_step_scheduled_req_ids = {
        r.req_id for i, r in enumerate(requests) if run.scheduled_iterations(i) > k_total - 1
    }
    running_after = []
    n_running = len(requests)
    for shape in shapes:
        n_running -= len(shape.finishing)
        running_after.append(n_running)
    if run.is_async:
        first_sampled = len(core.oldest_in_flight().num_scheduled_tokens)
        sampled = [first_sampled] + [s.num_scheduled for s in shapes[:-1]]
    else:
        sampled = [s.num_scheduled for s in shapes]
    last = None
    if run.is_async:
        shipped = set(shapes[-2].finishing) if k_total > 1 else finished_before
        last = _last_scheduled_output(run, k_total, starts, shapes[-1], shipped, bs)
    first_applied = run.first_applied_step_id()
    return AppliedRun(
        num_iterations=k_total,
        applied_step_ids=range(first_applied, first_applied + k_total),
        shapes=shapes,
        sampled_per_step=sampled,
        finished_per_step=finished,
        num_running_after=running_after,
        free_blocks_after=free_after,
        last_scheduled=last,
    )


def _take(it: Iterator[IterationShape], n: int) -> Iterator[IterationShape]:
    for _ in range(n):
        yield next(it)


def _finish(sched: Scheduler, req: Request) -> None:
    """The length stop: what ``update_from_output`` does when a request's last token lands."""
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    sched.finished_req_ids.add(req.req_id)
    sched.kv_cache_manager.free(req)
    del sched.requests[req.req_id]


def _cache_events(
    events: list[tuple[int, int, int, int, int]],
    i: int,
    c: int,
    m: int,
    scheduled: int,
    bs: int,
    d: int,
) -> None:
    """Prefix-cache registrations of request ``i`` at its schedules.

    schedule() of iteration k registers the full blocks covering ``c + k + 1 - d`` tokens
    (``d`` = 1 under async scheduling, where the known tokens lag one behind); the count only
    grows, by one block each time that position crosses a block boundary.
    """
    if scheduled < 1:
        return
    target = (c + 1 - d) // bs
    if target > m:
        events.append((0, _SCHEDULE, i, _CACHE, target))
        m = target
    first = (-(c + 1 - d)) % bs or bs
    for k in range(first, scheduled, bs):
        target = (c + k + 1 - d) // bs
        if target > m:
            events.append((k, _SCHEDULE, i, _CACHE, target))
            m = target


def _last_scheduled_output(
    run: UniformDecodeRun,
    k_total: int,
    starts: list[int],
    shape: IterationShape,
    finished_req_ids: set[str],
    bs: int,
) -> SchedulerOutput:
    """The SchedulerOutput of the run's last schedule() (async: it stays in flight)."""
    last_k = k_total - 1
    reqs = [
        (r, c) for i, (r, c) in enumerate(zip(run.requests, starts, strict=True))
        if run.scheduled_iterations(i) > last_k
    ]
    ids = [r.req_id for r, _ in reqs]
    cached = CachedRequestData(
        req_ids=ids,
        new_block_ids=[[r.block_ids[-1]] if (c + last_k) % bs == 0 else None for r, c in reqs],
        num_computed_tokens=[c + last_k for _, c in reqs],
        # known outputs + the one placeholder in flight at that schedule() = final count
        num_output_tokens=[len(r.output_token_ids) for r, _ in reqs],
    )
    n = shape.num_scheduled
    batch = BatchShape(
        num_reqs=n,
        num_tokens=n,
        prefill_query_lens=(),
        prefill_context_lens=(),
        num_decode_reqs=n,
        decode_context_sum=shape.context_sum,
        decode_context_max=shape.context_max,
        num_sampling_reqs=n,
    )
    return SchedulerOutput(
        step_id=run.first_step_id + last_k,
        scheduled_new_reqs=[],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=dict.fromkeys(ids, 1),
        total_num_scheduled_tokens=n,
        partial_prefill_req_ids=set(),
        preempted_req_ids=set(),
        finished_req_ids=finished_req_ids,
        batch_shape=batch,
        admission_blocker=shape.blocker,
    )
