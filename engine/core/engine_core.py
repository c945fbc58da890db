"""One engine step, shared by every driver: the golden replay, the simulator and the real loop.

``begin_step(now)`` schedules a batch (if the scheduler has requests) and puts it in flight;
the driver hands it to its executor; ``must_finish_step()`` says whether the driver must now
wait for the *oldest* in-flight batch — that is vLLM's ``step_with_batch_queue`` rule, with a
queue of ``EngineConfig.max_concurrent_batches``: 1 (synchronous ``step()``), 2 (async
scheduling: step N+1 is scheduled before step N's output is applied) or the pipeline-parallel
degree (one batch per stage, synchronous scheduler); ``finish_step(out, runner_out, now)``
applies it.

The core never reads a clock: every method takes ``now``. It writes the request events of
ARCHITECTURE.md §4 that happen inside the engine (enqueued, scheduled, preempted, tokens,
finished; rejected when the scheduling policy sheds a request) and one ``StepRecord`` per
applied step. A shed request's final output (no tokens, finish reason "abort") comes with the
next applied step's outputs, so every driver delivers it the way it delivers finishes.

A scheduling policy that holds every waiting request back (admit says WAIT) while nothing runs
leaves the engine with no work until its next input (``held_by_policy``): drivers then idle
instead of spinning through empty steps. A driver that expects no more input while the policy
holds requests back must say so (``held_by_policy``): they can never run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.core.bulk.apply import apply_bulk_run
from engine.core.bulk.find import find_bulk_run
from engine.core.bulk.records import AppliedRun, RunTiming, run_step_columns
from engine.core.bulk.run import BulkRun
from engine.core.config import EngineConfig
from engine.core.events import EventKind, EventLog, StepRecord
from engine.core.outputs import (
    AdmissionBlocker,
    EngineCoreOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from engine.core.policy import SchedulingPolicy, StreamInfo
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.scheduler import Scheduler


@dataclass(slots=True)
class _InFlight:
    """A scheduled batch whose output has not been applied yet."""

    sched_out: SchedulerOutput
    schedule_time_s: float

    def __init__(self, sched_out: SchedulerOutput, schedule_time_s: float) -> None:
        self.sched_out = sched_out
        self.schedule_time_s = schedule_time_s


class EngineCore:
    """The scheduler plus the batch queue and the engine-side event records."""

    def __init__(
        self,
        config: EngineConfig,
        event_log: EventLog | None = None,
        *,
        replica: int = 0,
        first_step_id: int = 0,
        policy: SchedulingPolicy | None = None,
        stream: StreamInfo | None = None,
    ) -> None:
        """``policy``: the scheduling policy (default: the config's, built with what ``stream``
        says of the requests to come; see ``Scheduler``)."""
        self.config = config
        self.replica = replica  # data-parallel rank (engines may share one event log)
        self.scheduler = Scheduler(
            config, first_step_id=first_step_id, policy=policy, stream=stream
        )
        self.event_log = event_log if event_log is not None else EventLog()
        self.batch_queue_size = config.max_concurrent_batches
        self._in_flight: deque[_InFlight] = deque()
        self._must_finish = False
        self._first_token_seen: set[str] = set()
        self._shed: list[EngineCoreOutput] = []  # rejected by the policy, not yet returned
        self._held = False  # the last schedule() ran nothing: the policy held everyone back
        self.rejected_reasons: dict[str, str] = {}  # every request the policy shed: why

    # -- inputs ---------------------------------------------------------------------------------
    def add_request(self, request: Request, now: float) -> None:
        self._held = False
        self.scheduler.add_request(request)
        self.event_log.record(request.req_id, EventKind.ENGINE_ENQUEUED, now)

    def abort_requests(self, req_ids: Iterable[str], now: float) -> list[EngineCoreOutput]:
        """Abort requests (client gone); returns their final outputs."""
        self._held = False
        aborted = self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)
        outs = []
        for request in aborted:
            self._record_finish(request.req_id, "abort", now)
            outs.append(EngineCoreOutput(request.req_id, [], request.get_finished_reason()))
        return outs

    # -- the step -------------------------------------------------------------------------------
    def has_work(self) -> bool:
        """Requests to schedule, finished ids to report, or batches in flight — unless the
        scheduling policy holds every waiting request back with nothing running (see the
        module docstring)."""
        if self._held and not self._in_flight and not self.scheduler.finished_req_ids:
            return False
        return self.scheduler.has_requests() or bool(self._in_flight)

    @property
    def held_by_policy(self) -> bool:
        """Requests wait, nothing runs, and the policy admitted none at the last schedule()."""
        return self._held and not self._in_flight and self.scheduler.has_unfinished_requests()

    def begin_step(self, now: float) -> SchedulerOutput | None:
        """Schedule and queue one batch, if the scheduler has requests; None otherwise."""
        scheduler = self.scheduler
        if not scheduler.has_requests():
            self._must_finish = bool(self._in_flight)
            return None
        out = scheduler.schedule(now)
        if scheduler.custom_policy is not None:
            self._held = (
                out.admission_blocker == AdmissionBlocker.POLICY and not scheduler.running
            )
        self._in_flight.append(_InFlight(out, now))
        executed = out.total_num_scheduled_tokens > 0
        self._must_finish = not (
            len(self._in_flight) < self.batch_queue_size
            and (executed or scheduler.has_requests())
        )
        self._record_schedule(out, now)
        return out

    def must_finish_step(self) -> bool:
        """After ``begin_step``: must the driver now wait for and apply the oldest batch?"""
        return self._must_finish

    def oldest_in_flight(self) -> SchedulerOutput:
        return self._in_flight[0].sched_out

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def finish_step(
        self,
        sched_out: SchedulerOutput,
        runner_out: ModelRunnerOutput,
        now: float,
        *,
        execute_start_s: float | None = None,
        execute_end_s: float | None = None,
    ) -> list[EngineCoreOutput]:
        """Apply the oldest in-flight batch's output; returns per-request outputs."""
        if not self._in_flight or self._in_flight[0].sched_out is not sched_out:
            raise ValueError("finish_step must apply the oldest in-flight batch first")
        flight = self._in_flight.popleft()
        outputs = self.scheduler.update_from_output(sched_out, runner_out)
        self._record_outputs(sched_out.step_id, outputs, now)
        if self._shed:
            outputs.extend(self._shed)
            self._shed = []
        self._record_step(
            flight, outputs, now, execute_start_s, execute_end_s, runner_out.execute_time_s
        )
        return outputs

    # -- bulk runs ------------------------------------------------------------------------------
    def find_bulk_run(self, token_id: int) -> BulkRun | None:
        """Before ``begin_step``: the iterations that could be bulk-applied from here (see
        ``engine/core/bulk``). A run starts with one batch in flight under async scheduling and
        with none otherwise; a pipeline-parallel engine (several synchronous batches in flight)
        runs step by step."""
        in_flight = self._in_flight
        if (self.config.pipeline_parallel_size > 1
                or len(in_flight) != self.batch_queue_size - 1 or self._shed):
            return None
        pending = in_flight[0].sched_out if in_flight else None
        return find_bulk_run(self.scheduler, pending, token_id)

    def apply_bulk_run(
        self, run: BulkRun, num_iterations: int, token_id: int, timing: RunTiming
    ) -> AppliedRun:
        """Apply ``num_iterations`` iterations of ``run`` exactly as step-by-step execution
        would, with every sampling request sampling ``token_id``; records tokens and steps."""
        timing.check_length(num_iterations)
        previous = self._in_flight[0] if run.is_async else None
        applied = apply_bulk_run(self.scheduler, run, num_iterations, token_id)
        self.scheduler.note_bulk_schedules(timing.schedule_time_s[:num_iterations])
        if previous is not None:
            self._in_flight.popleft()
        if applied.last_scheduled is not None:
            self._in_flight.append(_InFlight(applied.last_scheduled, timing.schedule_time_s[-1]))
        self._must_finish = run.is_async  # the driver resumes with a full queue
        self._record_run(run, applied, timing, previous)
        return applied

    def _record_run(
        self, run: BulkRun, applied: AppliedRun, timing: RunTiming, previous: _InFlight | None
    ) -> None:
        log = self.event_log
        k_total = applied.num_iterations
        first_step = applied.applied_step_ids.start
        first_seen = self._first_token_seen
        updates = timing.update_time_s
        for i, req in enumerate(run.requests):
            count = applied.token_count[i]
            if not count:
                continue
            req_id = req.req_id
            start = applied.token_start[i]
            if req_id not in first_seen:
                first_seen.add(req_id)
                log.record(req_id, EventKind.FIRST_TOKEN, updates[start])
            log.record_tokens(req_id, first_step + start, count)
        requests = run.requests
        if run.admitted:
            log.record(requests[run.prefill_index].req_id, EventKind.SCHEDULED,
                       timing.schedule_time_s[0], run.prefill_context[0])
        for pos, f in enumerate(run.finish_iters):
            if f >= k_total:
                break
            self._record_finish(requests[run.finish_order[pos]].req_id, "length", updates[f])
        usable = self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
        # Under async scheduling the first applied step is the batch that was in flight: its
        # own record. The iterations' schedules are the rest.
        skip = 0
        if previous is not None:
            skip = 1
            log.record_step(_step_record(
                previous.sched_out,
                previous.schedule_time_s,
                timing.execute_start_s[0],
                timing.execute_end_s[0],
                updates[0],
                applied.sampled_per_step[0],
                applied.finished_per_step[0],
                applied.num_running_after[0],
                run.num_waiting,
                1.0 - applied.free_blocks_after[0] / usable,
                timing.cost_s[0],
                self.replica,
            ))
        if k_total > skip:
            log.record_steps(run_step_columns(run, applied, timing, skip, usable, self.replica))

    # -- events ---------------------------------------------------------------------------------
    def _record_schedule(self, out: SchedulerOutput, now: float) -> None:
        log = self.event_log
        for new in out.scheduled_new_reqs:
            log.record(new.req_id, EventKind.SCHEDULED, now, new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        if cached.resumed_req_ids:
            for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
                if req_id in cached.resumed_req_ids:
                    log.record(req_id, EventKind.SCHEDULED, now, computed)
        for req_id in sorted(out.preempted_req_ids):
            log.record(req_id, EventKind.PREEMPTED, now)
        if out.rejected:
            self.rejected_reasons.update(out.rejected)
            for req_id, reason in out.rejected.items():
                log.record(req_id, EventKind.REJECTED, now, reason)
                log.close_request(req_id)
                self._first_token_seen.discard(req_id)
                self._shed.append(EngineCoreOutput(req_id, [], FinishReason.ABORT))

    def _record_outputs(self, step_id: int, outputs: list[EngineCoreOutput], now: float) -> None:
        log = self.event_log
        first_seen = self._first_token_seen
        for out in outputs:
            req_id = out.req_id
            if out.new_token_ids:
                if req_id not in first_seen:
                    first_seen.add(req_id)
                    log.record(req_id, EventKind.FIRST_TOKEN, now)
                log.record_token(req_id, step_id)
            if out.finish_reason is not None:
                self._record_finish(req_id, str(out.finish_reason), now)

    def _record_finish(self, req_id: str, reason: str, now: float) -> None:
        self.event_log.record(req_id, EventKind.FINISHED, now, reason)
        self.event_log.close_request(req_id)
        self._first_token_seen.discard(req_id)

    def _record_step(
        self,
        flight: _InFlight,
        outputs: list[EngineCoreOutput],
        now: float,
        execute_start_s: float | None,
        execute_end_s: float | None,
        cost_s: float | None,
    ) -> None:
        out = flight.sched_out
        scheduler = self.scheduler
        num_finished = 0
        num_sampled = 0
        for o in outputs:
            num_sampled += len(o.new_token_ids)
            if o.finish_reason is not None:
                num_finished += 1
        self.event_log.record_step(_step_record(
            out,
            flight.schedule_time_s,
            flight.schedule_time_s if execute_start_s is None else execute_start_s,
            now if execute_end_s is None else execute_end_s,
            now,
            num_sampled,
            num_finished,
            len(scheduler.running),
            len(scheduler.waiting),
            scheduler.kv_cache_manager.usage,
            0.0 if cost_s is None else cost_s,
            self.replica,
        ))


def _step_record(
    out: SchedulerOutput,
    schedule_time_s: float,
    execute_start_s: float,
    execute_end_s: float,
    update_time_s: float,
    num_sampled: int,
    num_finished: int,
    num_running: int,
    num_waiting: int,
    kv_usage: float,
    cost_s: float,
    replica: int,
) -> StepRecord:
    """One applied step: the batch's own fields from ``out``, the rest as the caller observed
    them."""
    shape = out.batch_shape
    # positional, in field order: every step passes here, and from the Python sources a call
    # with 22 keywords costs three times as much
    return StepRecord(
        out.step_id,
        schedule_time_s,
        execute_start_s,
        execute_end_s,
        update_time_s,
        shape.num_reqs,
        shape.num_tokens,
        len(shape.prefill_query_lens),  # num_prefill_reqs
        shape.num_tokens - shape.num_decode_reqs,  # num_prefill_tokens
        shape.num_decode_reqs,
        shape.decode_context_sum,
        num_sampled,
        len(out.scheduled_new_reqs),  # num_new_reqs
        len(out.scheduled_cached_reqs.resumed_req_ids),  # num_resumed_reqs
        len(out.preempted_req_ids),  # num_preempted_reqs
        num_finished,
        num_running,
        num_waiting,
        kv_usage,
        str(out.admission_blocker),
        cost_s,
        replica,
    )
