"""``BulkRun``: the iterations that can be bulk-applied from one engine state, and their shapes.

``find.py`` checks a state and builds the run from it (each request's decode interval, the tail
prefiller, an admission the first iteration makes); the run then computes the shape of each
iteration on demand (``ensure_shapes``), up to its limits. Every attribute is written by the
run's own methods; ``find.py``, ``apply.py``, ``records.py`` and the simulator read them.
"""

from __future__ import annotations

from typing import Final

from engine.core.bulk.shapes import NO_ITERATION, DecodeSet, FinishOrder, order_by
from engine.core.chunking import effective_long_prefill_threshold, running_chunk
from engine.core.outputs import AdmissionBlocker, BatchShape
from engine.core.request import Request

# Final module constants are native statics when compiled (a plain global is a dict lookup).
NONE: Final = AdmissionBlocker.NONE
TOKEN_BUDGET: Final = AdmissionBlocker.TOKEN_BUDGET
MAX_NUM_SEQS: Final = AdmissionBlocker.MAX_NUM_SEQS
KV_CACHE: Final = AdmissionBlocker.KV_CACHE

#: Iterations of shapes computed at a time beyond what the driver asked for (shapes past its
#: horizon would be wasted work; the driver asks for its estimate first).
SHAPE_CHUNK: Final = 8


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
        pending_num_sampled: int,
        context_at_start: list[int],
        finish_iteration: list[int],
        prefill_index: int,
    ) -> None:
        """A run of the running ``requests`` as they are now: every one but the prefiller (at
        ``prefill_index``, −1: none) decodes from iteration 0 with context
        ``context_at_start[i]`` until its decode end (``decode_end_of``) and finishes at
        ``finish_iteration[i]`` (the prefiller's entries are 0 and ``NO_ITERATION``)."""
        self.requests = requests
        self.first_step_id = first_step_id  # step id of the run's first schedule()
        self.num_waiting = num_waiting  # requests waiting throughout (admissions stay blocked)
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.is_async = is_async
        self.pending_num_sampled = pending_num_sampled  # async: tokens the batch in flight samples
        n = len(requests)
        self.decode_start: list[int] = [0] * n
        end_lag = decode_end_of(0, is_async)
        decode_end = [f + end_lag for f in finish_iteration]
        if prefill_index >= 0:
            decode_end[prefill_index] = NO_ITERATION
        self.decode_end = decode_end
        self.finish_iteration = finish_iteration
        self.context_at_start = context_at_start
        self.prefill_index = prefill_index
        self.prefill_done_iteration = NO_ITERATION  # j: the prefiller's last chunk
        # the first schedule() admits the prefiller (``admit``): its first chunk, the admission
        # verdict after it, and the free hit blocks it takes from the free queue
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
        # the head of the waiting queue does not fit while this many requests run (−1: no
        # such head): its KV blocks stay refused until a finish frees some (``block_head``)
        self.head_blocked_while = -1
        self.limit = NO_ITERATION  # first iteration that may not be bulk-applied
        self.max_kv_iterations = NO_ITERATION  # most iterations whose blocks surely fit
        # the shape computation's cursors
        bits = n.bit_length()
        mask = (1 << bits) - 1
        by_finish = order_by(finish_iteration, list(range(n)), bits)
        finish_order = [key & mask for key in by_finish]
        # decode ends are the finishes shifted by one constant: ordered alike (one sort)
        end_order = [i for i in finish_order if i != prefill_index and decode_end[i] > 0]
        self._decodes = DecodeSet(
            [context_at_start[i] for i in end_order], end_order, self.decode_start, decode_end,
            context_at_start,
        )
        self._finishes = FinishOrder(finish_order, [key >> bits for key in by_finish])
        self._running = n  # running requests at the next schedule()
        self._x_join = NO_ITERATION  # iteration the prefiller starts decoding
        self._x_context = 0  # the prefiller's context before its next chunk
        self._x_num_tokens = 0  # its known tokens (constant while it prefills)
        if prefill_index >= 0:  # it decodes once its prefill is planned (``_prefill_done``)
            self.decode_start[prefill_index] = NO_ITERATION
            self._x_context = requests[prefill_index].num_computed_tokens
            self._x_num_tokens = requests[prefill_index].num_tokens

    # -- set-up (find.py) -----------------------------------------------------------------------
    def admit(
        self, request: Request, chunk: int, blocker: AdmissionBlocker, touched: int, num_hits: int
    ) -> None:
        """The run's first schedule() admits ``request`` (the head of the waiting queue, with
        ``num_hits`` prefix-hit tokens) with a first chunk of ``chunk`` tokens, then stops
        admitting with ``blocker``; ``touched`` hit blocks leave the free queue. It becomes the
        prefiller, last in running order."""
        i = len(self.requests)
        self.requests.append(request)
        self.decode_start.append(NO_ITERATION)
        self.decode_end.append(NO_ITERATION)
        self.finish_iteration.append(NO_ITERATION)
        self.context_at_start.append(0)
        self._finishes.add_unknown(i)
        self.prefill_index = i
        self.admitted = True
        self.admission_blocker = blocker
        self.admission_chunk = chunk
        self.admission_touched = touched
        self.num_waiting -= 1
        self._running = i + 1
        self._x_context = num_hits
        self._x_num_tokens = request.num_tokens

    def block_head(self) -> None:
        """The head of the waiting queue cannot get its KV blocks now, and cannot before a
        request finishes (``find.py`` checked why): schedules that try it record
        ``KV_CACHE`` until then, and the first after a finish ends the run."""
        self.head_blocked_while = self._running

    def limit_kv_iterations(self, num_iterations: int) -> None:
        """At most ``num_iterations`` iterations: more might not find their KV blocks."""
        self.max_kv_iterations = num_iterations

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

    @property
    def finish_order(self) -> list[int]:
        return self._finishes.order

    @property
    def finish_iters(self) -> list[int]:
        return self._finishes.iters

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
            self.extend_shapes(target if target < top else top)
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
        return self._finishes.finishing(k)

    def finish_counts(self, num_iterations: int) -> list[int]:
        """Requests finishing at each update of iterations ``0..num_iterations − 1``."""
        return self._finishes.counts(num_iterations)

    def scheduled_at(self, k: int) -> list[int]:
        """Indexes of the requests iteration ``k``'s schedule() schedules, in running order."""
        x = self.prefill_index
        num_chunks = len(self.prefill_chunk)
        return [
            i for i in range(len(self.requests))
            if self.decode_start[i] <= k < self.decode_end[i] or (i == x and k < num_chunks)
        ]

    # -- the shape computation ------------------------------------------------------------------
    def extend_shapes(self, upto: int) -> None:
        """Compute iteration shapes until ``upto`` iterations exist or the run's limit is met
        (the limit is set where an iteration is not a run iteration)."""
        k = len(self.decoding)
        decodes, finishes = self._decodes, self._finishes
        offsets = decodes.offsets  # sorted; changed only by the set's own methods
        x = self.prefill_index
        waiting = self.num_waiting
        while k < upto and k < self.limit:
            if decodes.next_end <= k:
                decodes.retire_through(k)
            if k == self._x_join:
                decodes.join(self.context_at_start[x] - k)
            n = len(offsets)
            num_tokens = n
            prefilling = x >= 0 and self.prefill_done_iteration == NO_ITERATION
            admitting = k == 0 and self.admitted  # planned by find.py
            if admitting:
                num_tokens += self.admission_chunk
            elif prefilling:
                q = self._prefill_chunk(n)
                if q <= 0:
                    self.limit = k  # the prefiller would get nothing: not a run state
                    break
                num_tokens += q
            elif n == 0:
                self.limit = k  # nothing would be scheduled
                break
            if admitting:
                if waiting:
                    self.blockers.append(self.admission_blocker)
            elif waiting:
                blocker = self.blocker_of(num_tokens, self._running)
                if blocker == NONE:
                    self.limit = k  # this schedule() would try to admit
                    break
                self.blockers.append(blocker)
            if prefilling:
                c = self._x_context
                self.prefill_chunk.append(num_tokens - n)
                self.prefill_context.append(c)
                self._x_context = c + num_tokens - n
                if self._x_context >= self._x_num_tokens:
                    self._prefill_done(k)
            self.decoding.append(n)
            self.context_sum.append(decodes.offset_sum + n * k)
            self.context_max.append(offsets[-1] + k if n else 0)
            if finishes.next_finish <= k:
                self._running -= finishes.consume_through(k)
            k += 1

    def blocker_of(self, num_scheduled_tokens: int, num_running: int) -> AdmissionBlocker:
        """``_schedule_waiting``'s verdict for a schedule of ``num_scheduled_tokens`` with
        ``num_running`` running requests, or NONE when an admission might succeed (or nobody
        waits; the caller tells them apart)."""
        if not self.num_waiting:
            return NONE
        if self.token_budget - num_scheduled_tokens <= 0:
            return TOKEN_BUDGET
        if num_running >= self.max_num_seqs:
            return MAX_NUM_SEQS
        if num_running == self.head_blocked_while:  # no finish yet: the head still does not fit
            return KV_CACHE
        return NONE

    def _prefill_chunk(self, num_decodes: int) -> int:
        """Tokens ``_schedule_running`` gives the prefiller after ``num_decodes`` decodes."""
        c = self._x_context
        threshold = effective_long_prefill_threshold(
            self.long_prefill_token_threshold, self._running + self.num_waiting
        )
        return running_chunk(
            self._x_num_tokens - c, threshold, self.token_budget - num_decodes, c,
            self.max_model_len,
        )

    def _prefill_done(self, j: int) -> None:
        """The prefiller's chunk of iteration ``j`` completes its known tokens: from ``j + 1`` it
        decodes (context = its known tokens) until its finish."""
        self.prefill_done_iteration = j
        i = self.prefill_index
        req = self.requests[i]
        t = self._x_num_tokens
        start = j + 1
        # its first token lands at the update of j (synchronous) or j + 1 (async: in flight),
        # then one a step until its length limit
        first = start if self.is_async else j
        finish = first + tokens_left(
            req.max_tokens - req.num_output_tokens, self.max_model_len - t
        )
        end = decode_end_of(finish, self.is_async)
        self.decode_start[i] = start
        self.decode_end[i] = end
        self.context_at_start[i] = t
        self.finish_iteration[i] = finish
        self._finishes.place(i, finish)
        if end > start:
            self._x_join = start
            self._decodes.expect_end(i)


def decode_end_of(finish: int, is_async: bool) -> int:
    """The end (exclusive) of the decode interval of a request finishing at the update of
    iteration ``finish``. Synchronously a token scheduled in iteration k lands at update k, so
    its last token is scheduled in ``finish`` itself and the interval ends one later; under
    async scheduling it lands at update k + 1, so the last one was scheduled in ``finish − 1``
    and the interval ends at ``finish``."""
    return finish if is_async else finish + 1


def tokens_left(outputs_left: int, tokens_left: int) -> int:
    """Updates after the next one before a request stops: the next token ends it when it
    reaches max_tokens or max_model_len (a prompt of max_model_len tokens stops at its first
    token)."""
    left = min(outputs_left, tokens_left) - 1
    return left if left > 0 else 0
