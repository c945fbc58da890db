"""vLLM V1's scheduler: ``schedule()`` and ``update_from_output()`` with its exact decisions.

There is no prefill phase and no decode phase: each step every request tries to bring
``num_computed_tokens`` up to ``num_tokens`` (+ in-flight placeholders under async scheduling)
within one token budget. ``schedule()`` visits RUNNING requests first, in admission order —
preempting from the back (FCFS) or the lowest priority (PRIORITY) when KV blocks run out — and
then, only if nothing was preempted, admits WAITING requests while the budget, ``max_num_seqs``
and the KV cache allow. See SCHEDULER_SPEC.md §2 for every rule implemented here; golden
replays of vLLM's own decisions check them step for step.

Five of those decisions are the scheduling policy's (``policy.py``): the waiting order, the
running order, the victim, admit-now and the prefill chunk limit. vLLM's own policy
(``VllmPolicy``) is written inline here — the compiled hot path never calls it; any other policy
(``custom_policy``) is called at those five points, and the rest of the rules stay these.

Out of scope (SCHEDULER_SPEC §2.12): speculative decoding, encoder/multimodal budgets,
structured output, KV connectors, hybrid models, LoRA, streaming sessions, DP prefill cadence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

from engine.core.chunking import admission_chunk, effective_long_prefill_threshold, running_chunk
from engine.core.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.outputs import (
    AdmissionBlocker,
    EngineCoreOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from engine.core.policy import (
    AdmissionView,
    BulkProperty,
    PolicyContext,
    SchedulingPolicy,
    StreamInfo,
    Verdict,
    VllmPolicy,
    build_policy,
)
from engine.core.queues import as_waiting_queue
from engine.core.request import Request, RequestStatus
from engine.core.step_output import (
    StepPlan,
    advance_scheduled,
    cached_request_data,
    new_request_data,
)

# Final module constants are native statics when compiled (a plain global is a dict lookup).
RUNNING: Final = RequestStatus.RUNNING
WAITING: Final = RequestStatus.WAITING
PREEMPTED: Final = RequestStatus.PREEMPTED
FINISHED_LENGTH_CAPPED: Final = RequestStatus.FINISHED_LENGTH_CAPPED
FINISHED_ABORTED: Final = RequestStatus.FINISHED_ABORTED
#: Weight of the newest interval in the step-time estimate policies see (``AdmissionView``).
STEP_TIME_WEIGHT: Final = 0.25


class Scheduler:
    """Decides, step by step, which requests compute how many tokens (clock-free)."""

    def __init__(
        self,
        config: EngineConfig,
        first_step_id: int = 0,
        policy: SchedulingPolicy | None = None,
        stream: StreamInfo | None = None,
    ) -> None:
        """``policy``: the scheduling policy (default: the one the config names, built with
        what ``stream`` says of the requests to come)."""
        sc, cc = config.scheduler, config.cache
        self.first_step_id = first_step_id  # step ids start here (disjoint per DP replica)
        self.config = config
        self.max_model_len = sc.max_model_len
        self.max_num_seqs = sc.max_num_seqs
        self.token_budget = sc.token_budget
        self.enable_chunked_prefill = sc.enable_chunked_prefill
        self.long_prefill_token_threshold = sc.long_prefill_token_threshold
        if policy is None:
            policy = build_policy(PolicyContext(sc, stream or StreamInfo()))
        self.policy = policy
        # vLLM's own policy runs on the inline code below; any other through the protocol
        vllm = isinstance(policy, VllmPolicy) and type(policy) is VllmPolicy
        self.custom_policy: SchedulingPolicy | None = None if vllm else policy
        self.priority_policy = isinstance(policy, VllmPolicy) and vllm and policy.priority
        # a victim may be anywhere in the running list (not only at its back)
        self.victim_anywhere = not vllm or self.priority_policy
        # what the bulk path may rely on (engine/core/bulk/find.py; policy.BulkProperty)
        props = policy.bulk_properties
        self.bulk_running_order = BulkProperty.RUNNING_ORDER in props
        self.bulk_admission = BulkProperty.ADMISSION in props
        self.bulk_chunking = BulkProperty.CHUNKING in props
        self.reserve_full_isl = sc.scheduler_reserve_full_isl
        self.async_scheduling = sc.async_scheduling
        self.block_size = cc.block_size
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks=cc.num_gpu_blocks,
            block_size=cc.block_size,
            max_model_len=sc.max_model_len,
            enable_caching=cc.enable_prefix_caching,
            watermark_blocks=cc.watermark_blocks,
        )
        self.requests: dict[str, Request] = {}
        self.waiting = as_waiting_queue(policy.new_waiting_queue())
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # since the previous schedule()
        self.preempted_req_ids: set[str] = set()  # during the current schedule()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.num_steps = 0  # schedule() calls so far
        self.num_preemptions = 0
        # custom policies only: the clock at this schedule(), and the busy step-time estimate
        self.now_s = 0.0
        self.step_time_s = 0.0
        self.busy_since: tuple[float, int] | None = None  # (clock, num_steps) of a busy step
        self.rejected: dict[str, str] = {}  # shed during the current schedule()

    # -- requests in and out --------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request (status WAITING) at the tail of the waiting queue."""
        if request.req_id in self.requests:
            raise ValueError(f"duplicate request id {request.req_id!r}")
        self.waiting.add_request(request)
        self.requests[request.req_id] = request

    def finish_requests(
        self, req_ids: str | Iterable[str] | None, status: RequestStatus
    ) -> list[Request]:
        """Finish requests from outside (abort): dequeue, free their blocks, forget them.

        ``req_ids`` is one id, several, or None for every request (vLLM's signature). Unknown
        or already finished ids are ignored; returns the requests actually finished.
        """
        if not RequestStatus.is_finished(status):
            raise ValueError(f"{status.name} is not a finished status")
        if req_ids is None:
            ids: Iterable[str] = list(self.requests)
        elif isinstance(req_ids, str):
            ids = (req_ids,)
        else:
            ids = dict.fromkeys(req_ids)
        found: list[Request] = []
        for req_id in ids:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished():
                found.append(request)
        running_ids = {id(r) for r in found if r.status == RUNNING}
        if running_ids:
            self.running = [r for r in self.running if id(r) not in running_ids]
        waiting = [r for r in found if r.status != RUNNING]
        if waiting:
            self.waiting.remove_requests(waiting)
        for request in found:
            request.status = status
            self._free_request(request)
        return found

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        return len(self.running), len(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ids the workers have not been told about yet."""
        return bool(self.running) or bool(self.waiting) or bool(self.finished_req_ids)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget all cached prefixes; with ``reset_running_requests`` preempt everything first."""
        if reset_running_requests:
            while self.running:
                self._preempt_request(self.running.pop(), drop_stale_output=True)
            self.prev_step_scheduled_req_ids.clear()
        ok = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not ok:
            raise RuntimeError("prefix cache reset failed with every request preempted")
        return ok

    # -- schedule -------------------------------------------------------------------------------
    def schedule(self, now_s: float = 0.0) -> SchedulerOutput:
        """Plan one step: running requests first, then admissions; see the module docstring.
        ``now_s`` is the engine's clock (custom policies may read it; vLLM's does not)."""
        self.num_steps += 1
        plan = StepPlan(self.token_budget)
        custom = self.custom_policy
        if custom is None:
            threshold = self._effective_long_prefill_threshold()
        else:
            threshold = self._begin_custom_step(custom, now_s)
        self._schedule_running(plan, threshold)
        if not plan.preempted:
            self._schedule_waiting(plan, threshold)
        elif self.waiting:
            plan.blocker = AdmissionBlocker.PREEMPTION
        assert len(self.running) <= self.max_num_seqs
        if custom is not None:  # a step with requests running: busy from here
            self.busy_since = (now_s, self.num_steps) if self.running else None
        return self._finalize(plan)

    def _effective_long_prefill_threshold(self) -> int:
        """The long-prefill threshold in force this step (``chunking.py``)."""
        return effective_long_prefill_threshold(
            self.long_prefill_token_threshold, len(self.running) + len(self.waiting)
        )

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        """The policy's prefill chunk limit with ``num_unfinished_requests`` running or
        waiting (the bulk path predicts chunks with it)."""
        custom = self.custom_policy
        if custom is None:
            return effective_long_prefill_threshold(
                self.long_prefill_token_threshold, num_unfinished_requests
            )
        return custom.prefill_chunk_limit(num_unfinished_requests)

    def _begin_custom_step(self, policy: SchedulingPolicy, now_s: float) -> int:
        """A custom policy's step: note the clock (and the busy step time), put the running
        list in the policy's order, and return its prefill chunk limit."""
        self._note_clock(now_s, self.num_steps, bool(self.running))
        order = policy.order_running(self.running)
        if order is not None:
            running = self.running
            if len(order) != len(running) or {id(r) for r in order} != {id(r) for r in running}:
                raise ValueError(
                    f"scheduling policy {policy.name!r}: order_running must return a "
                    "permutation of the running requests"
                )
            self.running = list(order)
        return policy.prefill_chunk_limit(len(self.running) + len(self.waiting))

    def _note_clock(self, now_s: float, step: int, running: bool) -> None:
        """The clock at schedule() call ``step``, and the step-time estimate: the time per
        step since the last step that left requests running, if one still runs at this call
        (``running``: the engine was busy throughout, since admissions happen only in
        schedule()), smoothed."""
        busy = self.busy_since
        if busy is not None and running and now_s > busy[0]:
            interval = (now_s - busy[0]) / (step - busy[1])
            last = self.step_time_s
            self.step_time_s = (
                interval if last == 0.0 else last + STEP_TIME_WEIGHT * (interval - last)
            )
        self.now_s = now_s

    def _schedule_running(self, plan: StepPlan, threshold: int) -> None:
        """Phase A: give each RUNNING request its next tokens, preempting on KV shortage."""
        running = self.running
        kv = self.kv_cache_manager  # (methods called through it: a native call when compiled)
        max_model_len = self.max_model_len
        max_model_len_1 = max_model_len - 1
        num_scheduled = plan.num_scheduled_tokens
        new_block_ids = plan.new_block_ids
        scheduled_running = plan.scheduled_running
        budget = plan.token_budget
        req_index = 0
        while req_index < len(running) and budget > 0:
            request = running[req_index]
            placeholders = request.num_output_placeholders
            computed = request.num_computed_tokens
            if (
                placeholders > 0
                and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens
            ):
                # Async: in-flight outputs already reach max_tokens; do not over-schedule.
                req_index += 1
                continue
            num_new = request.num_tokens + placeholders - computed
            if num_new != 1 or computed >= max_model_len_1:
                # (a decode's one token passes every cap of running_chunk but max_model_len's:
                # most requests of most steps skip the call)
                num_new = running_chunk(num_new, threshold, budget, computed, max_model_len)
            if num_new <= 0:
                req_index += 1
                continue
            new_blocks = kv.allocate_running_slots(request, num_new)
            while new_blocks is None:
                victim = self._pick_victim()
                if self.victim_anywhere:
                    victim_index = running.index(victim)
                    del running[victim_index]
                    if victim_index < req_index:
                        req_index -= 1
                    refund = num_scheduled.pop(victim.req_id, None)
                    if refund is not None:
                        scheduled_running.remove(victim)
                        del new_block_ids[victim.req_id]
                        budget += refund
                else:
                    running.pop()
                self._preempt_request(victim)
                plan.preempted.append(victim)
                if victim is request:
                    break
                new_blocks = kv.allocate_running_slots(request, num_new)
            if new_blocks is None:
                if self.victim_anywhere and request.status == PREEMPTED:
                    continue  # it preempted itself; req_index already points at the next one
                break
            scheduled_running.append(request)
            num_scheduled[request.req_id] = num_new
            new_block_ids[request.req_id] = new_blocks
            budget -= num_new
            req_index += 1
        plan.token_budget = budget

    def _pick_victim(self) -> Request:
        """FCFS: the most recently admitted; PRIORITY: largest (priority, arrival_time); a
        custom policy's choice (one of the running requests)."""
        custom = self.custom_policy
        if custom is not None:
            victim = custom.pick_victim(self.running)
            if not any(r is victim for r in self.running):
                raise ValueError(
                    f"scheduling policy {custom.name!r}: pick_victim must return a running "
                    f"request, got {victim!r}"
                )
            return victim
        if self.priority_policy:
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _schedule_waiting(self, plan: StepPlan, threshold: int) -> None:
        """Phase B: admit WAITING requests in queue order until something does not fit."""
        waiting, running = self.waiting, self.running
        kv = self.kv_cache_manager
        skipped: deque[Request] = deque()
        budget = plan.token_budget
        blocker = AdmissionBlocker.NONE
        custom = self.custom_policy
        while waiting:
            if budget <= 0:
                blocker = AdmissionBlocker.TOKEN_BUDGET
                break
            if len(running) >= self.max_num_seqs:
                blocker = AdmissionBlocker.MAX_NUM_SEQS
                break
            request = waiting.peek_request()
            if request.num_stale_output_tokens and not request.drop_stale_output:
                # Async: outputs from before its preemption are still in flight.
                skipped.appendleft(waiting.pop_request())
                continue
            if custom is not None:
                verdict = self._ask_admission(custom, request, budget)
                if verdict == Verdict.WAIT:
                    blocker = AdmissionBlocker.POLICY
                    break
                if verdict == Verdict.REJECT:
                    continue
            hit_blocks, num_hit_tokens = kv.get_computed_blocks(request)
            num_new = admission_chunk(
                request.num_tokens - num_hit_tokens, threshold, budget, self.enable_chunked_prefill
            )
            if num_new == 0:  # over the budget without chunked prefill
                blocker = AdmissionBlocker.TOKEN_BUDGET
                break  # no smaller request behind it is tried
            new_blocks = kv.allocate_slots(
                request,
                num_new,
                num_hit_tokens,
                hit_blocks,
                full_sequence_must_fit=self.reserve_full_isl,
                has_scheduled_reqs=bool(running),
            )
            if new_blocks is None:
                blocker = AdmissionBlocker.KV_CACHE
                break  # a waiting request never preempts
            kv.record_prefix_cache_stats(request, num_hit_tokens)
            waiting.pop_request()
            running.append(request)
            if request.status == WAITING:
                plan.scheduled_new.append(request)
            else:
                plan.scheduled_resumed.append(request)
            plan.new_block_ids[request.req_id] = list(request.block_ids)
            plan.num_scheduled_tokens[request.req_id] = num_new
            budget -= num_new
            request.status = RUNNING
            request.num_computed_tokens = num_hit_tokens
        if skipped:
            waiting.prepend_requests(skipped)
        plan.token_budget = budget
        plan.blocker = blocker

    def _ask_admission(self, policy: SchedulingPolicy, request: Request, budget: int) -> Verdict:
        """A custom policy's admit-now for the head of the queue; a rejected request leaves
        the queue finished (aborted) and its reason is kept for the step's output."""
        view = AdmissionView(
            now_s=self.now_s,
            step_time_s=self.step_time_s,
            token_budget=budget,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_free_blocks=self.kv_cache_manager.get_num_free_blocks(),
        )
        decision = policy.admit(request, view)
        if decision.verdict == Verdict.REJECT:
            self.waiting.pop_request()
            request.status = FINISHED_ABORTED
            self._free_request(request)
            self.rejected[request.req_id] = decision.reason or f"rejected by {policy.name}"
        return decision.verdict

    def _preempt_request(self, request: Request, drop_stale_output: bool = False) -> None:
        """Free the request's KV and put it back at the front of the waiting queue."""
        self.kv_cache_manager.free_preempted(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.preempted_req_ids.add(request.req_id)

    # -- bulk runs (engine/core/bulk applies many iterations at once through these) -------------
    def take_finished_req_ids(self) -> set[str]:
        """The ids finished since the previous schedule(), which the next one ships to the
        workers; cleared (a bulk run's first schedule() ships them)."""
        finished = self.finished_req_ids
        self.finished_req_ids = set()
        return finished

    def admit_waiting(self, token_budget: int) -> StepPlan:
        """``schedule()``'s admission phase alone, with ``token_budget`` tokens left by the
        running requests (a bulk run's first schedule(), whose running requests the bulk path
        applies itself); returns its plan."""
        plan = StepPlan(token_budget)
        self._schedule_waiting(
            plan, self.prefill_chunk_limit(len(self.running) + len(self.waiting))
        )
        return plan

    def finish_length_capped(self, request: Request) -> None:
        """A bulk run applied ``request``'s last token (its length limit): finish and free it
        as ``update_from_output`` does; it leaves RUNNING in ``end_bulk_run``."""
        request.status = FINISHED_LENGTH_CAPPED
        self._free_request(request)

    def end_bulk_run(
        self,
        num_steps: int,
        stopped: Iterable[Request],
        finished_req_ids: set[str],
        scheduled_req_ids: set[str],
    ) -> None:
        """The bookkeeping of ``num_steps`` schedule() calls applied in bulk: the ``stopped``
        requests (finished during the run) leave RUNNING; ``finished_req_ids`` are the ones the
        run's last update finished (the next schedule() ships them), ``scheduled_req_ids`` the
        ones its last schedule() scheduled."""
        gone = {id(r) for r in stopped}
        if gone:
            self.running = [r for r in self.running if id(r) not in gone]
        self.num_steps += num_steps
        self.finished_req_ids = finished_req_ids
        self.prev_step_scheduled_req_ids = scheduled_req_ids

    def note_bulk_schedules(self, schedule_times_s: Sequence[float]) -> None:
        """A bulk run's schedule() calls happened at ``schedule_times_s`` (after
        ``end_bulk_run``): a custom policy's clock and step time follow them one by one, as
        they would have step by step (every call of a run finds and leaves requests
        running)."""
        if self.custom_policy is None or not schedule_times_s:
            return
        first_step = self.num_steps - len(schedule_times_s) + 1
        for k, now_s in enumerate(schedule_times_s):
            self._note_clock(now_s, first_step + k, True)
            self.busy_since = (now_s, first_step + k)

    # -- the output of schedule() ---------------------------------------------------------------
    def _finalize(self, plan: StepPlan) -> SchedulerOutput:
        """Build the SchedulerOutput, then advance ``num_computed_tokens`` (before execution)."""
        num_scheduled = plan.num_scheduled_tokens
        new_reqs = [
            new_request_data(r, plan.new_block_ids[r.req_id]) for r in plan.scheduled_new
        ]
        cached = cached_request_data(plan, self.prev_step_scheduled_req_ids)
        self.prev_step_scheduled_req_ids = set(num_scheduled)
        shape, partial = advance_scheduled(self.requests, num_scheduled, self.async_scheduling)
        out = SchedulerOutput(
            step_id=self.first_step_id + self.num_steps - 1,
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=shape.num_tokens,
            partial_prefill_req_ids=partial,
            preempted_req_ids=self.preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            batch_shape=shape,
            admission_blocker=plan.blocker,
        )
        if self.rejected:
            out.rejected = self.rejected
            self.rejected = {}
        self.finished_req_ids = set()
        self.preempted_req_ids = set()
        return out

    # -- update_from_output ---------------------------------------------------------------------
    def update_from_output(
        self, sched_out: SchedulerOutput, runner_out: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Apply a step's sampled tokens: append, check stops, free finished requests."""
        outputs: list[EngineCoreOutput] = []
        requests = self.requests
        sampled = runner_out.sampled_token_ids
        kv = self.kv_cache_manager
        max_model_len = self.max_model_len
        stopped_running: list[Request] = []
        stopped_waiting: list[Request] = []
        for req_id, n in sched_out.num_scheduled_tokens.items():
            request = requests.get(req_id)
            if request is None:
                continue  # finished (aborted) while in flight
            request.num_in_flight_tokens -= n
            stale = False
            if request.num_stale_output_tokens > 0:
                stale = True
                request.num_stale_output_tokens -= n
            status_before = request.status
            if status_before > PREEMPTED or (stale and request.drop_stale_output):
                continue
            new_token_ids = sampled.get(req_id)
            if not new_token_ids:
                continue  # a partial prefill chunk: nothing to emit
            placeholders = request.num_output_placeholders
            if len(new_token_ids) == 1 and not stale:
                stopped = request.append_sampled_token(new_token_ids[0], max_model_len)
                if placeholders > 0:
                    request.num_output_placeholders = placeholders - 1
            else:
                new_token_ids, stopped = self._append_outputs(request, new_token_ids, stale)
            if placeholders > 0 and not stale and status_before == RUNNING:
                kv.cache_blocks(
                    request, request.num_computed_tokens - request.num_in_flight_tokens
                )
            if stopped:
                self._free_request(request)
                (stopped_running if status_before == RUNNING else stopped_waiting).append(request)
                outputs.append(
                    EngineCoreOutput(
                        req_id, new_token_ids, request.get_finished_reason(), request.stop_reason
                    )
                )
            else:
                outputs.append(EngineCoreOutput(req_id, new_token_ids))
        if stopped_running:
            if len(stopped_running) == 1:
                self.running.remove(stopped_running[0])
            else:
                gone = {id(r) for r in stopped_running}
                self.running = [r for r in self.running if id(r) not in gone]
        if stopped_waiting:
            self.waiting.remove_requests(stopped_waiting)
        return outputs

    def _append_outputs(
        self, request: Request, new_token_ids: list[int], stale: bool
    ) -> tuple[list[int], bool]:
        """Append several sampled tokens (or stale ones) one at a time, trimming at a stop."""
        num_sampled = len(new_token_ids)
        stopped = False
        for i, token_id in enumerate(new_token_ids, 1):
            if request.append_sampled_token(token_id, self.max_model_len):
                stopped = True
                if i < num_sampled:
                    if not stale:
                        request.num_computed_tokens -= num_sampled - i
                    new_token_ids = new_token_ids[:i]
                break
        if not stale and request.num_output_placeholders > 0:
            request.num_output_placeholders -= num_sampled
        return new_token_ids, stopped

    def _free_request(self, request: Request) -> None:
        """Release a finished request's blocks now; tell workers at the next schedule()."""
        self.finished_req_ids.add(request.req_id)
        self.kv_cache_manager.free(request)
        del self.requests[request.req_id]

