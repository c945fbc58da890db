"""Exact bulk application of engine iterations between decisions ("bulk runs"): finding them.

Between two *decisions* — an admission, a preemption, a request arriving — the engine loop
follows a fixed pattern: every running request decodes one token per iteration until it reaches
its length limit, except possibly the **last** running request, which may still be prefilling
(it takes what the token budget leaves after the decodes, chunk by chunk, then decodes too).
This module recognises such a state and describes the iterations that follow it; ``fast_apply``
applies ``K`` of them at once with *exactly* the state changes ``K`` calls of
``begin_step``/``finish_step`` would make — the same tokens, counters, finishes, block tables,
block ids (popped from the free queue in the same order), frees, prefix-hash registrations (same
order) — in time O(R + K + K·R/B) instead of O(K·R). ``tests/core/test_fast_forward.py`` checks
the equality on random states.

One iteration is vLLM's engine loop body: ``schedule(S+k)`` then the update of the oldest batch
— step ``S+k`` itself when synchronous, step ``S+k−1`` under async scheduling (one batch stays
in flight, so updates lag one step, prefix caching lags one token, and a request whose last
token is in flight is skipped by ``schedule()``, finishing at that iteration's update).

**Decoders.** A request in the steady decode state at iteration ``a`` (context ``c`` = its
``num_computed_tokens`` before that schedule, ``n`` outputs, ``t`` known tokens, ``max_tokens``
M) gets a token at the updates of iterations ``a, a+1, …`` and finishes at the update of
``f = a + min(M − n, max_model_len − t) − 1``; it is scheduled (one token, context
``c + k − a``) in iterations ``a..f`` when synchronous and ``a..f−1`` under async scheduling.
Requests running at the start decode from ``a = 0``.

**The tail prefiller.** The last running request may be mid-prefill. In iteration ``k`` it is
scheduled ``min(remaining, token budget − decodes of iteration k)`` tokens (capped by the long
prefill threshold as the scheduler caps it) until a chunk completes its prompt, at iteration
``j``; from ``a = j + 1`` it is a decoder as above (synchronous: its first token came at the
update of ``j``; async: it arrives at the update of ``j + 1``).

**Limits.** A run never reaches an iteration whose ``schedule()`` would try to admit a waiting
request (budget left and a free seat), one that would schedule nothing, nor one whose KV blocks
might not fit (allocations are bounded by the free blocks at the start: frees during the run
are not counted, so no preemption can occur).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from engine.core.chunking import admission_chunk, effective_long_prefill_threshold, running_chunk
from engine.core.outputs import AdmissionBlocker, BatchShape
from engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from engine.core.engine_core import EngineCore
    from engine.core.hashing import BlockHash
    from engine.core.kv_cache_manager import KVCacheManager

# Final module constants are native statics when compiled (a plain global is a dict lookup).
NONE: Final = AdmissionBlocker.NONE
TOKEN_BUDGET: Final = AdmissionBlocker.TOKEN_BUDGET
MAX_NUM_SEQS: Final = AdmissionBlocker.MAX_NUM_SEQS

#: Iterations of shapes computed at a time beyond what the driver asked for (shapes past its
#: horizon would be wasted work; the driver asks for its estimate first).
SHAPE_CHUNK: Final = 8

NO_ITERATION: Final = 1 << 60  # "never" (a native int when compiled: below 2**62)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BulkRun:
    """A state from which up to ``max_iterations`` engine iterations can be bulk-applied, and
    the shape of each iteration, computed on demand by ``ensure_shapes``.

    Per request ``i`` (running order): it decodes in iterations ``[decode_start[i],
    decode_end[i])`` with context ``context_at_start[i]`` at ``decode_start[i]``, and finishes
    at the update of iteration ``finish_iteration[i]`` (``NO_ITERATION``: not known yet).
    ``prefill_index`` is the tail prefiller's index (−1: none); its chunk in iteration ``k`` <
    ``num_prefill_iterations`` is ``prefill_chunk[k]`` tokens on ``prefill_context[k]`` tokens
    of context, the last one (``prefill_done_iteration``, if known) completing its prefill.

    Per iteration ``k`` the lists hold the decodes only: ``decoding[k]`` requests, their
    contexts' sum and max; the accessors (``num_reqs(k)``, ``batch_shape(k)``, …) add the
    prefill chunk. ``finish_order`` lists request indexes by finish iteration (ties in running
    order), ``finish_iters`` their finish iterations.
    """

    def __init__(
        self,
        requests: list[Request],
        first_step_id: int,
        num_waiting: int,
        token_budget: int,
        max_num_seqs: int,
        max_model_len: int,
        long_prefill_token_threshold: int,
        is_async: bool,
    ) -> None:
        self.requests = requests
        self.first_step_id = first_step_id  # step id of the run's first schedule()
        self.num_waiting = num_waiting  # requests waiting throughout (admissions stay blocked)
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.is_async = is_async
        n = len(requests)
        self.decode_start: list[int] = [0] * n
        self.decode_end: list[int] = [0] * n
        self.finish_iteration: list[int] = [0] * n
        self.context_at_start: list[int] = [0] * n
        self.prefill_index = -1
        self.prefill_done_iteration = NO_ITERATION  # j: the prefiller's last chunk
        # the first schedule() admits the prefiller (``_plan_admission``): its first chunk,
        # the admission verdict after it, and the free hit blocks it takes from the free queue
        self.admitted = False
        self.admission_chunk = 0
        self.admission_blocker = NONE
        self.admission_touched = 0
        self.prefill_chunk: list[int] = []
        self.prefill_context: list[int] = []
        # iteration shapes of the decodes (one entry per iteration computed so far)
        self.decoding: list[int] = []  # decoding requests scheduled
        self.context_sum: list[int] = []  # Σ of their contexts
        self.context_max: list[int] = []  # max of those (0 if none)
        self.blockers: list[AdmissionBlocker] = []  # only when requests wait (else NONE)
        self.finish_order: list[int] = []
        self.finish_iters: list[int] = []
        self.limit = NO_ITERATION  # first iteration that may not be bulk-applied
        self.max_kv_iterations = NO_ITERATION  # most iterations whose blocks surely fit
        # incremental state of the shape computation
        self._end_order: list[int] = []  # decoding requests by decode_end (stable)
        self._end_ptr = 0
        self._finish_ptr = 0
        self._active: list[int] = []  # sorted offsets (context − start) of requests decoding
        self._offset_sum = 0
        self._running = n  # running requests at the next schedule()
        self._x_join = NO_ITERATION  # iteration the prefiller starts decoding
        self._x_context = 0  # the prefiller's context before its next chunk
        self._x_num_tokens = 0  # its known tokens (constant while it prefills)

    # -- the driver's view ----------------------------------------------------------------------
    @property
    def num_reqs_at_start(self) -> int:
        return len(self.requests)

    @property
    def num_prefill_iterations(self) -> int:
        return len(self.prefill_chunk)

    @property
    def max_iterations(self) -> int:
        """Most iterations that can be bulk-applied (exact once shapes reach the limit)."""
        return self.limit if self.limit < self.max_kv_iterations else self.max_kv_iterations

    def first_applied_step_id(self) -> int:
        """Step whose output the first iteration applies (one step earlier under async)."""
        return self.first_step_id - 1 if self.is_async else self.first_step_id

    def ensure_shapes(self, num_iterations: int) -> int:
        """Compute shapes through iteration ``num_iterations − 1`` (at most up to the run's
        limits); returns how many iterations are available."""
        have = len(self.decoding)
        top = self.max_iterations
        if have < num_iterations and have < top:
            target = have + SHAPE_CHUNK
            if target < num_iterations:
                target = num_iterations
            _extend_shapes(self, target if target < top else top)
            have = len(self.decoding)
            top = self.max_iterations
        return have if have < top else top

    # -- iteration k (computed) -----------------------------------------------------------------
    def prefill_tokens(self, k: int) -> int:
        """The prefiller's chunk in iteration ``k`` (0: none)."""
        return self.prefill_chunk[k] if k < len(self.prefill_chunk) else 0

    def num_reqs(self, k: int) -> int:
        """Requests scheduled by iteration ``k``."""
        return self.decoding[k] + (1 if k < len(self.prefill_chunk) else 0)

    def num_tokens(self, k: int) -> int:
        return self.decoding[k] + self.prefill_tokens(k)

    def num_sampling(self, k: int) -> int:
        """Requests sampling a token in iteration ``k`` (all but a partial chunk)."""
        return self.decoding[k] + (1 if k == self.prefill_done_iteration else 0)

    def blocker(self, k: int) -> AdmissionBlocker:
        return self.blockers[k] if self.num_waiting else NONE

    def batch_shape(self, k: int) -> BatchShape:
        """The ``BatchShape`` of iteration ``k``'s schedule() (``advance_scheduled``'s)."""
        n = self.decoding[k]
        csum, cmax = self.context_sum[k], self.context_max[k]
        q = self.prefill_tokens(k)
        q_lens: tuple[int, ...] = ()
        ctx_lens: tuple[int, ...] = ()
        num_decodes = n
        if q > 1:
            q_lens = (q,)
            ctx_lens = (self.prefill_context[k],)
        elif q == 1:  # a one-token chunk counts as a decode in the batch shape
            c = self.prefill_context[k]
            num_decodes += 1
            csum += c
            if c > cmax:
                cmax = c
        return BatchShape(
            num_reqs=n + (1 if q else 0),
            num_tokens=n + q,
            prefill_query_lens=q_lens,
            prefill_context_lens=ctx_lens,
            num_decode_reqs=num_decodes,
            decode_context_sum=csum,
            decode_context_max=cmax,
            num_sampling_reqs=self.num_sampling(k),
        )

    def finishing(self, k: int) -> list[int]:
        """Indexes of the requests finishing at the update of iteration ``k``, in running
        order."""
        iters = self.finish_iters
        lo, hi = 0, len(iters)
        while lo < hi:  # first position with iteration >= k
            mid = (lo + hi) // 2
            if iters[mid] < k:
                lo = mid + 1
            else:
                hi = mid
        end = lo
        while end < len(iters) and iters[end] == k:
            end += 1
        return self.finish_order[lo:end]

    def finish_counts(self, num_iterations: int) -> list[int]:
        """Requests finishing at each update of iterations ``0..num_iterations − 1``."""
        counts = [0] * num_iterations
        for f in self.finish_iters:
            if f >= num_iterations:
                break
            counts[f] += 1
        return counts

    def step_columns(self, num_iterations: int) -> tuple[list[int], ...]:
        """Step-record columns of iterations ``0..num_iterations − 1``: num_reqs, num_tokens,
        num_prefill_reqs, num_prefill_tokens, num_decode_reqs, decode_context_sum (as
        ``batch_shape`` has them)."""
        m = num_iterations
        num_reqs = self.decoding[:m]
        num_tokens = list(num_reqs)
        num_decodes = list(num_reqs)
        context_sum = self.context_sum[:m]
        prefill_reqs = [0] * m
        prefill_tokens = [0] * m
        for k in range(min(m, len(self.prefill_chunk))):
            q = self.prefill_chunk[k]
            num_reqs[k] += 1
            num_tokens[k] += q
            if q > 1:
                prefill_reqs[k] = 1
                prefill_tokens[k] = q
            else:
                num_decodes[k] += 1
                context_sum[k] += self.prefill_context[k]
        return num_reqs, num_tokens, prefill_reqs, prefill_tokens, num_decodes, context_sum

    def blocker_of(self, num_scheduled_tokens: int, num_running: int) -> AdmissionBlocker:
        """``_schedule_waiting``'s verdict for a schedule of ``num_scheduled_tokens`` with
        ``num_running`` running requests, or NONE when an admission would be tried (or nobody
        waits; the caller tells them apart)."""
        if not self.num_waiting:
            return NONE
        if self.token_budget - num_scheduled_tokens <= 0:
            return TOKEN_BUDGET
        if num_running >= self.max_num_seqs:
            return MAX_NUM_SEQS
        return NONE


def find_bulk_run(core: EngineCore, token_id: int) -> BulkRun | None:
    """The bulk run available now (before ``begin_step``), or None.

    ``token_id`` is the token every request will sample (the simulator's placeholder); it must
    not be an EOS or stop token of any running request.
    """
    sched = core.scheduler
    running = sched.running
    if not running or sched.preempted_req_ids:
        return None
    is_async = core.batch_queue_size == 2
    num_reqs = len(running)
    pending_tokens: dict[str, int] = {}
    pending_partial: set[str] = set()
    if is_async:
        # The batch in flight must hold every running request (a partial chunk only for the
        # last one, the prefiller).
        if core.num_in_flight != 1:
            return None
        pending = core.oldest_in_flight()
        pending_tokens = pending.num_scheduled_tokens
        pending_partial = pending.partial_prefill_req_ids
        if len(pending_tokens) != num_reqs or len(pending_partial) > 1:
            return None
    elif core.num_in_flight:
        return None
    budget = sched.token_budget
    if num_reqs > budget:
        return None
    last = running[-1]
    prefilling = _is_prefiller(last, pending_partial, is_async)
    num_waiting = len(sched.waiting)
    admits = False  # the run's first schedule() admits the head of the waiting queue
    head_hits: tuple[Sequence[int], int] = ((), 0)  # its prefix hits (blocks, tokens)
    if num_waiting and num_reqs < sched.max_num_seqs:
        # does the next schedule() leave budget to try an admission?
        if not prefilling:
            if num_reqs < budget:
                hits = _admission_hits(core, num_reqs)
                if hits is None:
                    return None  # the plan would refuse it: no need to set the run up
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
    run = BulkRun(
        requests=list(running),
        first_step_id=sched.first_step_id + sched.num_steps,
        num_waiting=num_waiting,
        token_budget=budget,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=sched.max_model_len,
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        is_async=is_async,
    )
    if not _set_up_requests(run, core, token_id, pending_tokens, prefilling):
        return None
    if admits and not _plan_admission(run, core, token_id, head_hits):
        return None
    if run.num_waiting:
        # Admissions must stay blocked throughout: shapes are computed up to the first
        # iteration that might admit (the limit).
        _extend_shapes(run, NO_ITERATION)
    else:
        # the prefiller's decode interval (needed for the KV bound) is known once its
        # prefill is planned
        while run.prefill_index >= 0 and run.prefill_done_iteration == NO_ITERATION and (
            len(run.decoding) < run.limit
        ):
            _extend_shapes(run, len(run.decoding) + SHAPE_CHUNK)
    _limit_by_free_blocks(run, sched.block_size, sched.kv_cache_manager.get_num_free_blocks())
    if run.max_iterations < 1 or run.ensure_shapes(1) < 1:
        return None
    return run


def _plan_admission(
    run: BulkRun, core: EngineCore, token_id: int, hits: tuple[Sequence[int], int]
) -> bool:
    """Plan the admission the run's first schedule() makes, asking the KV cache read-only what
    ``_schedule_waiting`` will find (``hits``: the head's prefix hits, looked up by
    ``_admission_hits``): the head of the waiting queue, a new request, is admitted
    with a first chunk, and nothing after it is tried (the queue is then empty, or the budget
    or the seats are used up). False if it would go otherwise (the step-by-step path decides).
    The admitted request becomes the run's prefiller; ``fast_apply`` admits it with the
    scheduler's own code and checks the outcome against this plan."""
    sched = core.scheduler
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
    i = len(run.requests)
    run.requests.append(request)
    run.decode_start.append(NO_ITERATION)
    run.decode_end.append(NO_ITERATION)
    run.finish_iteration.append(NO_ITERATION)
    run.context_at_start.append(0)
    run.finish_order.append(i)  # unknown finish: last
    run.finish_iters.append(NO_ITERATION)
    run.prefill_index = i
    run.admitted = True
    run.admission_blocker = blocker
    run.admission_chunk = num_new
    run.admission_touched = sum(1 for b in hit_blocks if ref_cnt[b] == 0)
    run.num_waiting -= 1
    run._running = num_running + 1
    run._x_context = num_hits
    run._x_num_tokens = request.num_tokens
    return True


def _admission_hits(core: EngineCore, num_reqs: int) -> tuple[Sequence[int], int] | None:
    """The prefix hits (blocks, tokens) of the head of the waiting queue, for
    ``_plan_admission``; None if a necessary condition of the plan fails, checked before a run
    is set up (KV memory often keeps the head waiting for many steps): the head cannot fit
    even with the most room the first schedule() could leave it — every free block still free
    (no decode takes one first) and the smallest first chunk (every running request decodes).
    ``slots_fit`` only gets harder with fewer free blocks or more tokens, so the plan, which
    also needs these hits to stand, would be refused. (The chunk is cut to the budget left as
    with chunked prefill, whose absence only refuses more.)"""
    sched = core.scheduler
    kv = sched.kv_cache_manager
    request = sched.waiting.peek_request()
    hit_blocks, num_hits = kv.get_computed_blocks(request)
    threshold = effective_long_prefill_threshold(  # a request runs, another waits: in force
        sched.long_prefill_token_threshold, num_reqs + len(sched.waiting)
    )
    num_new = admission_chunk(
        request.num_tokens - num_hits, threshold, sched.token_budget - num_reqs, True
    )
    if num_new > 0 and not kv.slots_fit(
        request, num_new, num_hits, hit_blocks,
        full_sequence_must_fit=sched.reserve_full_isl,
        has_scheduled_reqs=True,
        num_free_blocks=kv.get_num_free_blocks(),
    ):
        return None
    return hit_blocks, num_hits  # (no new tokens: the plan refuses it itself)


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


def _is_prefiller(req: Request, pending_partial: set[str], is_async: bool) -> bool:
    """Is the (last running) request mid-prefill, more than its last token left to compute?"""
    if req.num_output_placeholders:
        return False
    if is_async:
        return req.req_id in pending_partial and req.num_tokens > req.num_computed_tokens
    return req.num_tokens - req.num_computed_tokens >= 2 and not req.num_in_flight_tokens


def _set_up_requests(
    run: BulkRun, core: EngineCore, token_id: int, pending_tokens: dict[str, int],
    prefilling: bool,
) -> bool:
    """Check every request's state and fill in its decode interval; False: no run here."""
    sched = core.scheduler
    bs = sched.block_size
    max_model_len = sched.max_model_len
    is_async = run.is_async
    expected_ph = 1 if is_async else 0
    lag = 0 if is_async else 1  # num_tokens − num_computed_tokens in the steady state
    requests = run.requests
    num_reqs = len(requests)
    decoders = num_reqs - 1 if prefilling else num_reqs
    d_end = 1 if is_async else 0
    starts, ends, finishes = run.decode_start, run.decode_end, run.finish_iteration
    contexts = run.context_at_start
    active: list[int] = []
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
            return False
        if i == decoders:  # the prefiller
            run.prefill_index = i
            run._x_context = c
            run._x_num_tokens = req.num_tokens
            starts[i] = ends[i] = finishes[i] = NO_ITERATION
            continue
        if req.num_output_placeholders != expected_ph or req.num_tokens - c != lag:
            return False
        f = _tokens_left(req.max_tokens - len(req.output_token_ids), max_model_len - req.num_tokens)
        finishes[i] = f
        ends[i] = f + 1 - d_end
        contexts[i] = c
        if f + 1 - d_end > 0:
            active.append(c)
    active.sort()
    run._active = active
    total = 0
    for c in active:
        total += c
    run._offset_sum = total
    # orders by iteration, ties in running order (sorting packed ints: key << bits | index)
    bits = num_reqs.bit_length()
    mask = (1 << bits) - 1
    keys = [(ends[i] << bits) | i for i in range(decoders) if ends[i] > 0]
    keys.sort()
    run._end_order = [key & mask for key in keys]
    keys = [(finishes[i] << bits) | i for i in range(num_reqs)]
    keys.sort()
    run.finish_order = [key & mask for key in keys]
    run.finish_iters = [key >> bits for key in keys]
    return True


def _insert_sorted(values: list[int], v: int) -> None:
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    values.insert(lo, v)


def _insert_by_key(order: list[int], lo: int, i: int, keys: list[int]) -> None:
    """Insert index ``i`` into ``order[lo:]`` (sorted by ``keys``) after its equals."""
    hi = len(order)
    key = keys[i]
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[order[mid]] <= key:
            lo = mid + 1
        else:
            hi = mid
    order.insert(lo, i)


def _extend_shapes(run: BulkRun, upto: int) -> None:
    """Compute iteration shapes until ``upto`` iterations exist or the run's limit is met."""
    k = len(run.decoding)
    active = run._active
    end_order, ends = run._end_order, run.decode_end
    finish_iters = run.finish_iters
    x = run.prefill_index
    waiting = run.num_waiting
    while k < upto and k < run.limit:
        ptr = run._end_ptr
        while ptr < len(end_order) and ends[end_order[ptr]] <= k:
            i = end_order[ptr]
            v = run.context_at_start[i] - run.decode_start[i]
            active.remove(v)
            run._offset_sum -= v
            ptr += 1
        run._end_ptr = ptr
        if k == run._x_join:
            v = run.context_at_start[x] - k
            _insert_sorted(active, v)
            run._offset_sum += v
        n = len(active)
        num_tokens = n
        prefilling = x >= 0 and run.prefill_done_iteration == NO_ITERATION
        admitting = k == 0 and run.admitted  # planned by _plan_admission
        if admitting:
            num_tokens += run.admission_chunk
        elif prefilling:
            q = _prefill_chunk(run, n)
            if q <= 0:
                run.limit = k  # the prefiller would get nothing: not a run state
                break
            num_tokens += q
        elif n == 0:
            run.limit = k  # nothing would be scheduled
            break
        if admitting:
            if waiting:
                run.blockers.append(run.admission_blocker)
        elif waiting:
            blocker = run.blocker_of(num_tokens, run._running)
            if blocker == NONE:
                run.limit = k  # this schedule() would try to admit
                break
            run.blockers.append(blocker)
        if prefilling:
            c = run._x_context
            run.prefill_chunk.append(num_tokens - n)
            run.prefill_context.append(c)
            run._x_context = c + num_tokens - n
            if run._x_context >= run._x_num_tokens:
                _prefill_done(run, k)
        run.decoding.append(n)
        run.context_sum.append(run._offset_sum + n * k)
        run.context_max.append(active[-1] + k if n else 0)
        ptr = run._finish_ptr
        while ptr < len(finish_iters) and finish_iters[ptr] <= k:
            ptr += 1
        run._running -= ptr - run._finish_ptr
        run._finish_ptr = ptr
        k += 1


def _prefill_chunk(run: BulkRun, num_decodes: int) -> int:
    """Tokens ``_schedule_running`` gives the prefiller after ``num_decodes`` decodes."""
    c = run._x_context
    threshold = effective_long_prefill_threshold(
        run.long_prefill_token_threshold, run._running + run.num_waiting
    )
    return running_chunk(
        run._x_num_tokens - c, threshold, run.token_budget - num_decodes, c, run.max_model_len
    )


def _tokens_left(outputs_left: int, tokens_left: int) -> int:
    """Updates after the next one before a request stops: the next token ends it when it
    reaches max_tokens or max_model_len (a prompt of max_model_len tokens stops at its first
    token)."""
    left = min(outputs_left, tokens_left) - 1
    return left if left > 0 else 0


def _prefill_done(run: BulkRun, j: int) -> None:
    """The prefiller's chunk of iteration ``j`` completes its known tokens: from ``j + 1`` it
    decodes (context = its known tokens) until its finish."""
    run.prefill_done_iteration = j
    i = run.prefill_index
    req = run.requests[i]
    t = run._x_num_tokens
    n = len(req.output_token_ids)
    start = j + 1
    # its first token lands at the update of j (synchronous) or j + 1 (async: in flight), then
    # one a step until its length limit
    first = start if run.is_async else j
    finish = first + _tokens_left(req.max_tokens - n, run.max_model_len - t)
    end = finish if run.is_async else finish + 1
    run.decode_start[i] = start
    run.decode_end[i] = end
    run.context_at_start[i] = t
    run.finish_iteration[i] = finish
    # it was last in finish order (unknown finish): move it among the unconsumed entries
    order, iters = run.finish_order, run.finish_iters
    pos = order.index(i)
    del order[pos]
    del iters[pos]
    lo, hi = run._finish_ptr, len(iters)
    while lo < hi:  # after its equals: it is last in running order
        mid = (lo + hi) // 2
        if iters[mid] <= finish:
            lo = mid + 1
        else:
            hi = mid
    order.insert(lo, i)
    iters.insert(lo, finish)
    if end > start:
        run._x_join = start
        _insert_by_key(run._end_order, run._end_ptr, i, run.decode_end)


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


def _limit_by_free_blocks(run: BulkRun, bs: int, free: int) -> None:
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
        run.max_kv_iterations = hi
        return
    lo = 0  # allocs(lo) fits, allocs(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _num_allocs(run, mid, bs) <= free:
            lo = mid
        else:
            hi = mid
    run.max_kv_iterations = lo
