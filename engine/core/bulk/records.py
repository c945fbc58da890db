"""What a bulk run hands back and what it records: ``AppliedRun``, ``RunTiming``, step columns.

``apply.py`` returns an ``AppliedRun`` (what changed, per iteration); the driver gives the
run's ``RunTiming`` (when each iteration happened); ``run_step_columns`` turns both into the
``StepColumns`` the event log keeps for the run's own schedules — the same values the
step-by-step path records one ``StepRecord`` at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.bulk.run import BulkRun
from engine.core.events import StepColumns
from engine.core.outputs import AdmissionBlocker, SchedulerOutput


@dataclass(frozen=True, slots=True)
class RunTiming:
    """Times of a bulk-applied uniform decode run, from the driver's timeline (seconds).

    ``schedule_time_s[k]`` is when iteration k called schedule(); the other lists describe the
    steps whose outputs the iterations applied, in order (under async scheduling the first of
    them is the batch that was already in flight).
    """

    schedule_time_s: list[float]
    execute_start_s: list[float]
    execute_end_s: list[float]
    update_time_s: list[float]
    cost_s: list[float]

    # Written-out __init__s: compiled by mypyc (see engine/core/outputs.py's docstring).
    def __init__(
        self,
        schedule_time_s: list[float],
        execute_start_s: list[float],
        execute_end_s: list[float],
        update_time_s: list[float],
        cost_s: list[float],
    ) -> None:
        object.__setattr__(self, "schedule_time_s", schedule_time_s)
        object.__setattr__(self, "execute_start_s", execute_start_s)
        object.__setattr__(self, "execute_end_s", execute_end_s)
        object.__setattr__(self, "update_time_s", update_time_s)
        object.__setattr__(self, "cost_s", cost_s)

    def check_length(self, num_iterations: int) -> None:
        """Every list must hold one entry per iteration (``ValueError`` otherwise)."""
        if any(len(v) != num_iterations for v in (
            self.schedule_time_s, self.execute_start_s, self.execute_end_s, self.update_time_s,
            self.cost_s,
        )):
            raise ValueError("RunTiming lists must each hold num_iterations entries")


@dataclass(slots=True)
class AppliedRun:
    """What ``apply_bulk_run`` did, for the driver's records (lists indexed by iteration)."""

    num_iterations: int
    applied_step_ids: range  # steps whose outputs were applied, in order
    sampled_per_step: list[int]  # tokens each applied step produced
    finished_per_step: list[int]  # requests each applied step finished
    num_running_after: list[int]  # running requests after each update
    free_blocks_after: list[int]  # free KV blocks after each update
    token_start: list[int]  # per request of the run: iteration of its first token in the run
    token_count: list[int]  # ... and its tokens in the run
    last_scheduled: SchedulerOutput | None  # async: the batch left in flight

    # Written-out __init__s: compiled by mypyc (see engine/core/outputs.py's docstring).
    def __init__(
        self,
        num_iterations: int,
        applied_step_ids: range,
        sampled_per_step: list[int],
        finished_per_step: list[int],
        num_running_after: list[int],
        free_blocks_after: list[int],
        token_start: list[int],
        token_count: list[int],
        last_scheduled: SchedulerOutput | None,
    ) -> None:
        self.num_iterations = num_iterations
        self.applied_step_ids = applied_step_ids
        self.sampled_per_step = sampled_per_step
        self.finished_per_step = finished_per_step
        self.num_running_after = num_running_after
        self.free_blocks_after = free_blocks_after
        self.token_start = token_start
        self.token_count = token_count
        self.last_scheduled = last_scheduled


def run_step_columns(
    run: BulkRun,
    applied: AppliedRun,
    timing: RunTiming,
    skip: int,
    usable_blocks: int,
    replica: int,
) -> StepColumns:
    """The step records of the run's own schedules: iterations ``0..m − 1`` with ``m`` =
    applied iterations − ``skip``, where ``skip`` = 1 under async scheduling (the first applied
    step was scheduled before the run: the caller records it). ``usable_blocks``: the KV
    blocks behind ``kv_usage``."""
    k_total = applied.num_iterations
    m = k_total - skip
    first = applied.applied_step_ids.start
    num_reqs = run.decoding[:m]
    num_tokens = list(num_reqs)
    num_decodes = list(num_reqs)
    context_sum = run.context_sum[:m]
    prefill_reqs = [0] * m
    prefill_tokens = [0] * m
    for k in range(min(m, len(run.prefill_chunk))):  # as ``BulkRun.batch_shape`` counts
        q = run.prefill_chunk[k]
        num_reqs[k] += 1
        num_tokens[k] += q
        if q > 1:
            prefill_reqs[k] = 1
            prefill_tokens[k] = q
        else:
            num_decodes[k] += 1
            context_sum[k] += run.prefill_context[k]
    zeros = [0] * m
    new_reqs = zeros
    if run.admitted:
        new_reqs = [0] * m
        new_reqs[0] = 1
    if run.num_waiting:
        blockers = [str(b) for b in run.blockers[:m]]
    else:
        blockers = [str(AdmissionBlocker.NONE)] * m
    return StepColumns(
        step_id=list(range(first + skip, first + k_total)),
        schedule_time_s=timing.schedule_time_s[:m],
        execute_start_s=timing.execute_start_s[skip:],
        execute_end_s=timing.execute_end_s[skip:],
        update_time_s=timing.update_time_s[skip:],
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        num_prefill_reqs=prefill_reqs,
        num_prefill_tokens=prefill_tokens,
        num_decode_reqs=num_decodes,
        decode_context_sum=context_sum,
        num_sampled_tokens=applied.sampled_per_step[skip:],
        num_new_reqs=new_reqs,
        num_resumed_reqs=zeros,
        num_preempted_reqs=zeros,
        num_finished_reqs=applied.finished_per_step[skip:],
        num_running=applied.num_running_after[skip:],
        num_waiting=[run.num_waiting] * m,
        kv_usage=[1.0 - free / usable_blocks for free in applied.free_blocks_after[skip:]],
        admission_blocker=blockers,
        cost_s=timing.cost_s[skip:],
        replica=[replica] * m,
    )
