"""Finding a bulk run: is the engine state one, and how far can it be applied?

``find_bulk_run`` reads the scheduler (never writes it) and the batch in flight, checks every
running request is in a steady state, fills in the decode intervals of a ``BulkRun``, plans an
admission the run's first schedule() would make, and bounds the run by what might not fit in
the KV cache. Anything else is left to the step-by-step path: finding no run is always safe —
including every state where the scheduling policy's decisions might differ from vLLM's ones
the run would predict (the properties it does not declare: ``bulk/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.core.bulk.run import MAX_NUM_SEQS, NONE, SHAPE_CHUNK, TOKEN_BUDGET, BulkRun, tokens_left
from engine.core.bulk.shapes import NO_ITERATION
from engine.core.chunking import admission_chunk, effective_long_prefill_threshold, running_chunk
from engine.core.hashing import PrecomputedBlockHasher
from engine.core.outputs import SchedulerOutput
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler

if TYPE_CHECKING:
    from engine.core.hashing import BlockHash
    from engine.core.kv_cache_manager import KVCacheManager


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def find_bulk_run(
    sched: Scheduler, pending: SchedulerOutput | None, token_id: int
) -> BulkRun | None:
    """The bulk run available now (before the next schedule()), or None.

    ``pending`` is the batch in flight: exactly one under async scheduling, none when
    synchronous (the caller checks its queue). ``token_id`` is the token every request will
    sample (the simulator's placeholder); it must not be an EOS or stop token of any running
    request.
    """
    running = sched.running
    if not running or sched.preempted_req_ids or not sched.bulk_running_order:
        return None  # (the running order decides which blocks each request gets)
    is_async = sched.async_scheduling
    if (pending is not None) != is_async:
        raise ValueError("a bulk run needs one batch in flight under async scheduling, else none")
    num_reqs = len(running)
    pending_tokens: dict[str, int] = {}
    pending_partial: set[str] = set()
    if pending is not None:
        # The batch in flight must hold every running request (a partial chunk only for the
        # last one, the prefiller).
        pending_tokens = pending.num_scheduled_tokens
        pending_partial = pending.partial_prefill_req_ids
        if len(pending_tokens) != num_reqs or len(pending_partial) > 1:
            return None
    budget = sched.token_budget
    if num_reqs > budget:
        return None
    last = running[-1]
    prefilling = _is_prefiller(last, pending_partial, is_async)
    if prefilling and not sched.bulk_chunking:
        return None  # the policy chunks prefills its own way
    num_waiting = len(sched.waiting)
    admits = False  # the run's first schedule() admits the head of the waiting queue
    head_blocked = False  # ... or tries it and refuses it for KV blocks until a finish
    head_hits: tuple[Sequence[int], int] = ((), 0)  # its prefix hits (blocks, tokens)
    if num_waiting and num_reqs < sched.max_num_seqs:
        # does the next schedule() leave budget to try an admission?
        if not prefilling:
            if num_reqs < budget:
                if not (sched.bulk_admission and sched.bulk_chunking):
                    return None  # the policy decides admissions (or first chunks) its own way
                hits = _admission_hits(sched, num_reqs)
                if hits is None:  # it cannot fit: no admission to plan
                    if not _head_stays_blocked(sched):
                        return None
                    head_blocked = True
                elif _admits_another(sched, num_reqs, hits[1]):
                    return None  # its first schedule() admits two or more: step by step
                else:
                    head_hits = hits
                    admits = True  # planned (or refused) once the decodes are known
        else:
            # the least the prefiller's chunk leaves to an admission: every decoder decodes
            left = budget - (num_reqs - 1)
            threshold = effective_long_prefill_threshold(
                sched.long_prefill_token_threshold, num_reqs + num_waiting
            )
            chunk = running_chunk(
                last.num_tokens - last.num_computed_tokens, threshold, left,
                last.num_computed_tokens, sched.max_model_len,
            )
            if chunk < left:
                return None
    if is_async:
        for j, req_id in enumerate(pending_tokens):  # the batch lists them in running order
            if running[j].req_id != req_id:
                return None
    run = _set_up(sched, token_id, pending_tokens, pending_partial, prefilling)
    if run is None:
        return None
    if admits and not _plan_admission(run, sched, token_id, head_hits):
        return None
    if head_blocked:
        run.block_head()
    if run.num_waiting:
        # Admissions must stay blocked throughout: shapes are computed up to the first
        # iteration that might admit (the limit).
        run.extend_shapes(NO_ITERATION)
    else:
        # the prefiller's decode interval (needed for the KV bound) is known once its
        # prefill is planned
        while run.prefill_index >= 0 and run.prefill_done_iteration == NO_ITERATION and (
            len(run.decoding) < run.limit
        ):
            run.extend_shapes(len(run.decoding) + SHAPE_CHUNK)
    run.limit_kv_iterations(
        _max_iterations_by_free_blocks(
            run, sched.block_size, sched.kv_cache_manager.get_num_free_blocks()
        )
    )
    if run.max_iterations < 1 or run.ensure_shapes(1) < 1:
        return None
    return run


def _is_prefiller(req: Request, pending_partial: set[str], is_async: bool) -> bool:
    """Is the (last running) request mid-prefill, more than its last token left to compute?"""
    if req.num_output_placeholders:
        return False
    if is_async:
        return req.req_id in pending_partial and req.num_tokens > req.num_computed_tokens
    return req.num_tokens - req.num_computed_tokens >= 2 and not req.num_in_flight_tokens


def _set_up(
    sched: Scheduler,
    token_id: int,
    pending_tokens: dict[str, int],
    pending_partial: set[str],
    prefilling: bool,
) -> BulkRun | None:
    """Check every running request's state and build the run of their decode intervals (the
    last one, if ``prefilling``, is the prefiller); None: no run here."""
    bs = sched.block_size
    max_model_len = sched.max_model_len
    is_async = sched.async_scheduling
    expected_ph = 1 if is_async else 0
    lag = 0 if is_async else 1  # num_tokens − num_computed_tokens in the steady state
    requests = list(sched.running)
    num_reqs = len(requests)
    prefill_index = num_reqs - 1 if prefilling else -1
    contexts = [0] * num_reqs
    finishes = [NO_ITERATION] * num_reqs
    for i in range(num_reqs):
        req = requests[i]
        c = req.num_computed_tokens
        eos = req.eos_token_id
        if (
            req.num_stale_output_tokens
            or len(req.block_ids) != _cdiv(c, bs)
            or (eos is not None and eos == token_id)
            or (req.stop_token_ids and token_id in req.stop_token_ids)
            or req.num_in_flight_tokens != (pending_tokens[req.req_id] if is_async else 0)
        ):
            return None
        if i == prefill_index:
            continue
        if req.num_output_placeholders != expected_ph or req.num_tokens - c != lag:
            return None
        f = tokens_left(req.max_tokens - req.num_output_tokens, max_model_len - req.num_tokens)
        finishes[i] = f
        contexts[i] = c
    pending_sampled = len(pending_tokens) - len(pending_partial)
    return BulkRun(
        requests=requests,
        first_step_id=sched.first_step_id + sched.num_steps,
        num_waiting=len(sched.waiting),
        token_budget=sched.token_budget,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=max_model_len,
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        is_async=is_async,
        pending_num_sampled=pending_sampled,
        context_at_start=contexts,
        finish_iteration=finishes,
        prefill_index=prefill_index,
    )


def _plan_admission(
    run: BulkRun, sched: Scheduler, token_id: int, hits: tuple[Sequence[int], int]
) -> bool:
    """Plan the admission the run's first schedule() makes, asking the KV cache read-only what
    ``_schedule_waiting`` will find (``hits``: the head's prefix hits, looked up by
    ``_admission_hits``): the head of the waiting queue, a new request, is admitted
    with a first chunk, and nothing after it is tried (the queue is then empty, or the budget
    or the seats are used up). False if it would go otherwise (the step-by-step path decides).
    The admitted request becomes the run's prefiller; ``apply.py`` admits it with the
    scheduler's own code and checks the outcome against this plan."""
    kv = sched.kv_cache_manager
    request = sched.waiting.peek_request()
    eos = request.eos_token_id
    if (
        request.status != RequestStatus.WAITING
        or request.num_stale_output_tokens
        or request.num_computed_tokens
        or request.block_ids
        or (eos is not None and eos == token_id)
        or (request.stop_token_ids and token_id in request.stop_token_ids)
    ):
        return False
    num_running = len(run.requests)
    num_decodes = 0  # decodes scheduled in the first iteration (before the admission)
    num_new_blocks = 0  # and the blocks they allocate first
    bs = sched.block_size
    for i in range(num_running):
        if run.decode_end[i] > 0:
            num_decodes += 1
            if run.context_at_start[i] % bs == 0:
                num_new_blocks += 1
    hit_blocks, num_hits = hits
    left = run.token_budget - num_decodes
    threshold = effective_long_prefill_threshold(
        run.long_prefill_token_threshold, num_running + run.num_waiting
    )
    num_new = admission_chunk(
        request.num_tokens - num_hits, threshold, left, sched.enable_chunked_prefill
    )
    free = kv.get_num_free_blocks() - num_new_blocks
    if num_new <= 0 or not kv.slots_fit(
        request, num_new, num_hits, hit_blocks,
        full_sequence_must_fit=sched.reserve_full_isl,
        has_scheduled_reqs=num_running > 0,
        num_free_blocks=free,
    ):
        return False
    blocker = NONE
    if run.num_waiting > 1:  # what the admission loop checks before the next request
        if left - num_new <= 0:
            blocker = TOKEN_BUDGET
        elif num_running + 1 >= run.max_num_seqs:
            blocker = MAX_NUM_SEQS
        else:
            return False
    # the hits looked up now must be those the admission will see (checked last: the dearest)
    if kv.enable_caching and not _hits_survive_first_decodes(run, kv, request, num_new_blocks):
        return False
    ref_cnt = kv.block_pool.ref_cnt
    touched = sum(1 for b in hit_blocks if ref_cnt[b] == 0)
    run.admit(request, num_new, blocker, touched, num_hits)
    return True


def _admission_hits(sched: Scheduler, num_reqs: int) -> tuple[Sequence[int], int] | None:
    """The prefix hits (blocks, tokens) of the head of the waiting queue, for
    ``_plan_admission``; None if a necessary condition of the plan fails, checked before a run
    is set up (KV memory often keeps the head waiting for many steps): the head cannot fit
    even with the most room the first schedule() could leave it — every free block still free
    (no decode takes one first) and the smallest first chunk (every running request decodes;
    cut to the budget left as with chunked prefill, whose absence only refuses more).
    ``slots_fit`` only gets harder with fewer free blocks or more tokens, so the plan, which
    also needs these hits to stand, would be refused."""
    kv = sched.kv_cache_manager
    request = sched.waiting.peek_request()
    hit_blocks, num_hits = kv.get_computed_blocks(request)
    num_new = _chunk_with_least_budget(sched, num_reqs, num_hits)
    if num_new > 0 and not kv.slots_fit(
        request, num_new, num_hits, hit_blocks,
        full_sequence_must_fit=sched.reserve_full_isl,
        has_scheduled_reqs=True,
        num_free_blocks=kv.get_num_free_blocks(),
    ):
        return None
    return hit_blocks, num_hits  # (no new tokens: the plan refuses it itself)


def _chunk_with_least_budget(sched: Scheduler, num_reqs: int, num_hits: int) -> int:
    """The first chunk of the head of the waiting queue (``num_hits`` prefix-hit tokens) with
    the least budget the first schedule() can leave it: every running request decodes (cut
    to it as with chunked prefill; the threshold is in force, a request runs and another
    waits). With more budget left the chunk is the same, or larger only if cut here."""
    request = sched.waiting.peek_request()
    threshold = effective_long_prefill_threshold(
        sched.long_prefill_token_threshold, num_reqs + len(sched.waiting)
    )
    return admission_chunk(
        request.num_tokens - num_hits, threshold, sched.token_budget - num_reqs, True
    )


def _admits_another(sched: Scheduler, num_reqs: int, num_hits: int) -> bool:
    """Would the first schedule(), once it admits the head of the waiting queue, go on to try
    the next request? Then ``_plan_admission`` refuses the run (a run admits one request),
    so the run is not set up. Decided from the least budget left to the head
    (``_chunk_with_least_budget``): if its chunk leaves some of that budget, it leaves some
    of any larger one too, with the same chunk; and with a seat free and another request
    waiting, the admission loop carries on — where the plan returns False."""
    if len(sched.waiting) < 2 or num_reqs + 1 >= sched.max_num_seqs:
        return False
    return _chunk_with_least_budget(sched, num_reqs, num_hits) < sched.token_budget - num_reqs


def _head_stays_blocked(sched: Scheduler) -> bool:
    """The head of the waiting queue cannot fit now (``_admission_hits``): does it stay so,
    refused for its KV blocks by every schedule() before a request finishes?

    Until a finish nothing frees a block, and the decodes only take free blocks, which can
    only evict the head's prefix hits: the blocks it needs never fall below what was refused,
    the free ones never rise above. Its verdict stays ``KV_CACHE`` unless a hit is added —
    a block registered under a hash of its chain: so every block the running requests
    register from now on must be private (caching on). With chunked prefill off the verdict
    could turn to ``TOKEN_BUDGET`` as hits are lost, and a head with outputs still in flight
    is skipped, not tried: both are left to the step-by-step path."""
    if not sched.enable_chunked_prefill:
        return False
    head = sched.waiting.peek_request()
    if head.num_stale_output_tokens and not head.drop_stale_output:
        return False
    if not sched.kv_cache_manager.enable_caching:
        return True
    for req in sched.running:
        hasher = req.block_hasher
        if not (
            isinstance(hasher, PrecomputedBlockHasher)
            and hasher.private_from(req.num_cached_blocks, req.num_prompt_tokens)
        ):
            return False
    return True


def _hits_survive_first_decodes(
    run: BulkRun, kv: KVCacheManager, request: Request, num_new_blocks: int
) -> bool:
    """Does the admission see the prefix hits looked up now? In the first schedule() the
    decodes come first: their new blocks are popped from the free queue (evicting the hashes
    those blocks carry) and their newly full blocks are registered. If either could touch the
    request's hash chain, the plan is refused (the step-by-step path decides that step)."""
    pool = kv.block_pool
    bs = kv.block_size
    chain: set[BlockHash] | None = None
    for b in pool.free_queue.peek_n(num_new_blocks):
        if pool.in_map[b]:
            if chain is None:
                chain = set(request.block_hashes[: (request.num_tokens - 1) // bs])
            if pool.block_hash[b] in chain:
                return False
    lag = 0 if run.is_async else 1  # known tokens beyond the context at that schedule()
    for i in range(len(run.requests)):
        if run.decode_end[i] <= 0:
            continue  # not scheduled by the first schedule()
        req = run.requests[i]
        target = min((run.context_at_start[i] + lag) // bs, len(req.block_hashes))
        if target > req.num_cached_blocks:
            if chain is None:
                chain = set(request.block_hashes[: (request.num_tokens - 1) // bs])
            for j in range(req.num_cached_blocks, target):
                if req.block_hashes[j] in chain:
                    return False
    return True


def _num_allocs(run: BulkRun, iterations: int, bs: int) -> int:
    """KV blocks the first ``iterations`` iterations allocate (frees not counted)."""
    total = 0
    starts, ends, contexts = run.decode_start, run.decode_end, run.context_at_start
    for i in range(len(run.requests)):
        start = starts[i]
        if iterations > start:
            scheduled = (iterations if iterations < ends[i] else ends[i]) - start
            if scheduled > 0:
                c = contexts[i]
                total += _cdiv(c + scheduled, bs) - _cdiv(c, bs)
    chunks = min(iterations, len(run.prefill_chunk))
    if chunks > 0:
        end = run.prefill_context[chunks - 1] + run.prefill_chunk[chunks - 1]
        total += _cdiv(end, bs) - _cdiv(run.prefill_context[0], bs) + run.admission_touched
    return total


def _max_iterations_by_free_blocks(run: BulkRun, bs: int, free: int) -> int:
    """Largest K whose block allocations all fit in ``free`` blocks (conservative: frees of
    finishing requests during the run are not counted)."""
    hi = run.limit
    if hi == NO_ITERATION:  # no waiting: the last iteration that schedules anyone
        hi = len(run.prefill_chunk)
        for i in range(len(run.requests)):
            e = run.decode_end[i]
            if hi < e < NO_ITERATION:
                hi = e
    if _num_allocs(run, hi, bs) <= free:
        return hi
    lo = 0  # allocs(lo) fits, allocs(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _num_allocs(run, mid, bs) <= free:
            lo = mid
        else:
            hi = mid
    return lo
