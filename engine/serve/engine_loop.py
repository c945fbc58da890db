"""The real-world engine loop: ``EngineCore`` + an executor, one busy-loop iteration at a time.

Responsibility: drive the core exactly as every other driver does (``begin_step`` → executor →
``must_finish_step`` → ``finish_step`` on the *oldest* batch), i.e. vLLM's
``step_with_batch_queue``: with async scheduling step N+1 is scheduled before step N's output is
applied. The executor runs in-process and synchronously, so each batch executes right when it is
scheduled and its result waits here, FIFO, until the core asks for it; the worker appended its
own samples, so the next batch sees them.

Time comes from an injected ``clock`` (``time.perf_counter`` by default) and is passed to the
core as ``now``; each applied step carries the measured execute start/end. No torch here: any
object with ``execute_model(sched_out) -> ModelRunnerOutput`` is an executor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.engine_core import EngineCore
from engine.core.interfaces import Executor
from engine.core.outputs import EngineCoreOutput, ModelRunnerOutput


@dataclass(frozen=True, slots=True)
class _Executed:
    """A batch that ran and whose output the core has not applied yet."""

    output: ModelRunnerOutput
    start_s: float  # clock() when execution started
    end_s: float  # clock() when it ended


class EngineLoop:
    """One ``step()`` = one iteration of the engine core's busy loop."""

    def __init__(
        self,
        core: EngineCore,
        executor: Executor,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.core = core
        self.executor = executor
        self.clock = clock
        self._executed: dict[int, _Executed] = {}
        self.applied_step_id: int | None = None  # step whose outputs the last step() returned

    def has_work(self) -> bool:
        return self.core.has_work()

    def step(self) -> list[EngineCoreOutput]:
        """Schedule (and run) a batch if there is one; apply the oldest if the core says so."""
        core, clock = self.core, self.clock
        self.applied_step_id = None
        sched_out = core.begin_step(clock())
        if sched_out is not None:
            start = clock()
            result = self.executor.execute_model(sched_out)
            self._executed[sched_out.step_id] = _Executed(result, start, clock())
        if not core.must_finish_step():
            return []
        oldest = core.oldest_in_flight()
        done = self._executed.pop(oldest.step_id)
        self.applied_step_id = oldest.step_id
        return core.finish_step(
            oldest, done.output, clock(), execute_start_s=done.start_s, execute_end_s=done.end_s
        )
