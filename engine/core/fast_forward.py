"""Exact bulk application of identical pure-decode steps ("uniform decode runs").

When every running request is decoding one token per step, nothing waits that could be
admitted, no request finishes and KV blocks cannot run out, consecutive engine steps are all
alike: each running request gets one token. This module recognises such a state and applies
``K`` engine iterations at once with *exactly* the state changes ``K`` calls of
``begin_step``/``finish_step`` would make — the same tokens, counters, block tables, block ids
(popped from the free queue in the same order), prefix-hash registrations (same order) and the
same event records — in time O(R + K·R/B) instead of O(K·R). ``tests/core/test_fast_forward.py``
checks the equality on random states.

One iteration is vLLM's engine loop body: ``schedule(S+k)`` then the update of the oldest batch
— step ``S+k`` itself when synchronous, step ``S+k−1`` under async scheduling (one batch stays
in flight, so the update lags one step and prefix caching lags one token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.outputs import (
    AdmissionBlocker,
    BatchShape,
    CachedRequestData,
    SchedulerOutput,
)
from engine.core.request import Request

if TYPE_CHECKING:
    from engine.core.engine_core import EngineCore


@dataclass(frozen=True, slots=True)
class UniformDecodeRun:
    """A state from which ``max_iterations`` identical decode iterations can be bulk-applied."""

    requests: tuple[Request, ...]  # running requests, in running order
    max_iterations: int  # most iterations that stay uniform (no finish, no KV shortage)
    first_step_id: int  # step id of the first schedule() of the run
    context_sum: int  # Σ num_computed_tokens before the first step
    context_max: int  # max num_computed_tokens before the first step
    num_waiting: int  # requests waiting throughout (admissions persistently blocked)
    blocker: AdmissionBlocker  # why they cannot be admitted (NONE if none wait)
    is_async: bool

    @property
    def num_reqs(self) -> int:
        return len(self.requests)

    def first_applied_step_id(self) -> int:
        """Step whose output the first iteration applies (one step earlier under async)."""
        return self.first_step_id - 1 if self.is_async else self.first_step_id


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def find_uniform_decode_run(core: EngineCore, token_id: int) -> UniformDecodeRun | None:
    """The uniform decode run available now (before ``begin_step``), or None.

    ``token_id`` is the token every request will sample (the simulator's placeholder); it must
    not stop any request.
    """
    sched = core.scheduler
    running = sched.running
    if not running or sched.preempted_req_ids:
        return None
    is_async = core.batch_queue_size == 2
    if is_async:
        if core.num_in_flight != 1:
            return None
        pending = core.oldest_in_flight()
        if pending.partial_prefill_req_ids or len(pending.num_scheduled_tokens) != len(running):
            return None
        for req, (req_id, n) in zip(running, pending.num_scheduled_tokens.items(), strict=True):
            if req.req_id != req_id or n != 1:
                return None
    elif core.num_in_flight:
        return None
    num_reqs = len(running)
    if num_reqs > sched.token_budget:
        return None
    num_waiting = len(sched.waiting)
    blocker = AdmissionBlocker.NONE
    if num_waiting:
        # the same order of checks as Scheduler._schedule_waiting
        if num_reqs >= sched.token_budget:
            blocker = AdmissionBlocker.TOKEN_BUDGET
        elif num_reqs >= sched.max_num_seqs:
            blocker = AdmissionBlocker.MAX_NUM_SEQS
        else:
            return None
    bs = sched.block_size
    max_model_len = sched.max_model_len
    expected_ph = 1 if is_async else 0
    lag = 0 if is_async else 1  # num_tokens - num_computed_tokens in the steady state
    max_iter = 1 << 62
    ctx_sum = ctx_max = 0
    for req in running:
        c = req.num_computed_tokens
        if (
            req.num_output_placeholders != expected_ph
            or req.num_in_flight_tokens != expected_ph
            or req.num_stale_output_tokens
            or req.num_tokens - c != lag
            or len(req.block_ids) != _cdiv(c, bs)
            or token_id == req.eos_token_id
            or token_id in req.stop_token_ids
        ):
            return None
        t = req.num_tokens
        limit = min(req.max_tokens - len(req.output_token_ids), max_model_len - t) - 1
        if limit < max_iter:
            max_iter = limit
        ctx_sum += c
        if c > ctx_max:
            ctx_max = c
    if max_iter < 1:
        return None
    max_iter = _limit_by_free_blocks(running, max_iter, bs, sched.kv_cache_manager.get_num_free_blocks())
    if max_iter < 1:
        return None
    return UniformDecodeRun(
        requests=tuple(running),
        max_iterations=max_iter,
        first_step_id=sched.first_step_id + sched.num_steps,
        context_sum=ctx_sum,
        context_max=ctx_max,
        num_waiting=num_waiting,
        blocker=blocker,
        is_async=is_async,
    )


def _num_allocs(requests: list[Request], iterations: int, bs: int) -> int:
    return sum(
        _cdiv(r.num_computed_tokens + iterations, bs) - _cdiv(r.num_computed_tokens, bs)
        for r in requests
    )


def _limit_by_free_blocks(requests: list[Request], max_iter: int, bs: int, free: int) -> int:
    """Largest K <= max_iter whose block allocations all fit in ``free`` blocks."""
    if _num_allocs(requests, max_iter, bs) <= free:
        return max_iter
    lo, hi = 0, max_iter  # allocs(lo) fits, allocs(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _num_allocs(requests, mid, bs) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class AppliedRun:
    """What ``apply_uniform_decode`` did, for the driver's records."""

    num_iterations: int
    applied_step_ids: range  # steps whose outputs were applied, in order
    allocs_per_iteration: list[int]  # blocks allocated by each iteration's schedule()
    last_scheduled: SchedulerOutput | None  # async: the batch left in flight (replaces the old)


def apply_uniform_decode(
    core: EngineCore, run: UniformDecodeRun, num_iterations: int, token_id: int
) -> AppliedRun:
    """Apply ``num_iterations`` (1..run.max_iterations) iterations of ``run`` to the scheduler.

    Event records (token runs, first tokens, step records) are the caller's: see
    ``EngineCore.apply_uniform_decode``.
    """
    if not 1 <= num_iterations <= run.max_iterations:
        raise ValueError(f"num_iterations must be in [1, {run.max_iterations}]")
    sched = core.scheduler
    kv = sched.kv_cache_manager
    bs = sched.block_size
    k_total = num_iterations
    d = 1 if run.is_async else 0
    starts = [r.num_computed_tokens for r in run.requests]
    # 1. Per-request token, counter and hash updates (independent across requests).
    for req in run.requests:
        req.output_token_ids.extend([token_id] * k_total)
        all_ids = req._all_token_ids
        if all_ids is not None:
            all_ids.extend([token_id] * k_total)
        req.num_tokens += k_total
        req.num_computed_tokens += k_total
        req.is_prefill_chunk = False
        if req.block_hasher is not None:
            req.block_hasher.extend(req)
    # 2. Block allocations and prefix-cache registrations, in the exact (iteration, request)
    #    order the step-by-step scheduler performs them.
    events: list[tuple[int, int, int, int]] = []  # (iteration, request index, kind, arg)
    caching = kv.enable_caching
    for i, (req, c) in enumerate(zip(run.requests, starts, strict=True)):
        # schedule() of iteration k reserves slots for c + k + 1 tokens: a new block whenever
        # c + k is a multiple of the block size.
        for k in range((-c) % bs, k_total, bs):
            events.append((k, i, 0, 0))
        if caching:
            _cache_events(events, i, c, req.num_cached_blocks, k_total, bs, d)
    events.sort()
    allocs_per_iteration = [0] * k_total
    requests = run.requests
    pool = kv.block_pool
    for k, i, kind, arg in events:
        req = requests[i]
        if kind == 0:
            req.block_ids.extend(pool.get_new_blocks(1))
            allocs_per_iteration[k] += 1
        else:
            kv.cache_blocks(req, arg * bs)
    # 3. Scheduler bookkeeping, as after the last iteration.
    sched.num_steps += k_total
    sched.finished_req_ids = set()
    sched.prev_step_scheduled_req_ids = {r.req_id for r in requests}
    last = None
    if run.is_async:
        last = _last_scheduled_output(run, k_total, starts, bs)
    first_applied = run.first_applied_step_id()
    return AppliedRun(
        num_iterations=k_total,
        applied_step_ids=range(first_applied, first_applied + k_total),
        allocs_per_iteration=allocs_per_iteration,
        last_scheduled=last,
    )


def _cache_events(
    events: list[tuple[int, int, int, int]], i: int, c: int, m: int, k_total: int, bs: int, d: int
) -> None:
    """Prefix-cache registrations of request ``i`` over the run.

    schedule() of iteration k registers the full blocks covering ``c + k + 1 - d`` tokens
    (``d`` = 1 under async scheduling, where the known tokens lag one behind); the count only
    grows, by one block each time that position crosses a block boundary.
    """
    target = (c + 1 - d) // bs
    if target > m:
        events.append((0, i, 1, target))
        m = target
    first = (-(c + 1 - d)) % bs or bs
    for k in range(first, k_total, bs):
        target = (c + k + 1 - d) // bs
        if target > m:
            events.append((k, i, 1, target))
            m = target


def _last_scheduled_output(
    run: UniformDecodeRun, k_total: int, starts: list[int], bs: int
) -> SchedulerOutput:
    """The SchedulerOutput of the run's last schedule() (async: it stays in flight)."""
    last_k = k_total - 1
    ids = [r.req_id for r in run.requests]
    cached = CachedRequestData(
        req_ids=ids,
        new_block_ids=[
            [r.block_ids[-1]] if (c + last_k) % bs == 0 else None
            for r, c in zip(run.requests, starts, strict=True)
        ],
        num_computed_tokens=[c + last_k for c in starts],
        # known outputs + the one placeholder in flight at that schedule() = final count
        num_output_tokens=[len(r.output_token_ids) for r in run.requests],
    )
    n = run.num_reqs
    shape = BatchShape(
        num_reqs=n,
        num_tokens=n,
        prefill_query_lens=(),
        prefill_context_lens=(),
        num_decode_reqs=n,
        decode_context_sum=run.context_sum + n * last_k,
        decode_context_max=run.context_max + last_k,
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
        finished_req_ids=set(),
        batch_shape=shape,
        admission_blocker=run.blocker,
    )

