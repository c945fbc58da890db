"""The real-world engine loop: ``EngineCore`` + an executor, one busy-loop iteration at a time.

Responsibility: drive the core exactly as every other driver does (``begin_step`` → executor →
``must_finish_step`` → ``finish_step`` on the *oldest* batch), i.e. vLLM's
``step_with_batch_queue``: with async scheduling step N+1 is scheduled before step N's output is
applied. The executor runs in-process and synchronously, so each batch executes right when it is
scheduled and its result waits here, FIFO, until the core asks for it; the worker appended its
own samples, so the next batch sees them.

An executor whose device runs on a timeline of its own (``NonBlockingExecutor``: the emulated
device of ``twinserve serve --emulate``, a multi-process executor) is handed each batch with
``submit`` as soon as it is scheduled and waited for only when the core must apply it, so under
async scheduling step N+1 is scheduled while step N runs, as vLLM's batch queue does with
``execute_model(non_block=True)`` futures.

Time comes from an injected ``clock`` (``time.perf_counter`` by default) and is passed to the
core as ``now``; each applied step carries the measured execute start/end. No torch here: any
object with ``execute_model(sched_out) -> ModelRunnerOutput`` is an executor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.core.engine_core import EngineCore
from engine.core.interfaces import Executor
from engine.core.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput


class PendingBatch(Protocol):
    """A submitted batch: ``wait()`` blocks until it has run and returns its output and the
    device's start and end times (on the loop's clock)."""

    def wait(self) -> tuple[ModelRunnerOutput, float, float]: ...


@runtime_checkable
class NonBlockingExecutor(Protocol):
    """An executor that takes a batch and returns at once; the batch runs on its own device."""

    def submit(self, sched_out: SchedulerOutput) -> PendingBatch: ...


@dataclass(frozen=True, slots=True)
class _Executed:
    """A batch that ran and whose output the core has not applied yet."""

    output: ModelRunnerOutput
    start_s: float  # clock() when execution started
    end_s: float  # clock() when it ended

    def wait(self) -> tuple[ModelRunnerOutput, float, float]:
        return self.output, self.start_s, self.end_s


class EngineLoop:
    """One ``step()`` = one iteration of the engine core's busy loop."""

    def __init__(
        self,
        core: EngineCore,
        executor: Executor | NonBlockingExecutor,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.core = core
        self.executor = executor
        self.clock = clock
        self._executed: dict[int, PendingBatch] = {}
        self.applied_step_id: int | None = None  # step whose outputs the last step() returned

    def has_work(self) -> bool:
        return self.core.has_work()

    def step(self) -> list[EngineCoreOutput]:
        """Schedule (and run) a batch if there is one; apply the oldest if the core says so."""
        core, clock = self.core, self.clock
        self.applied_step_id = None
        sched_out = core.begin_step(clock())
        if sched_out is not None:
            self._executed[sched_out.step_id] = self._execute(sched_out)
        if not core.must_finish_step():
            return []
        oldest = core.oldest_in_flight()
        output, start_s, end_s = self._executed.pop(oldest.step_id).wait()
        self.applied_step_id = oldest.step_id
        return core.finish_step(
            oldest, output, clock(), execute_start_s=start_s, execute_end_s=end_s
        )

    def _execute(self, sched_out: SchedulerOutput) -> PendingBatch:
        executor = self.executor
        if isinstance(executor, NonBlockingExecutor):
            return executor.submit(sched_out)
        start = self.clock()
        result = executor.execute_model(sched_out)
        return _Executed(result, start, self.clock())
