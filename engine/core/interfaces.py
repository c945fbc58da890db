"""The two seams between the core and the worlds around it: executors and cost models.

An ``Executor`` turns one ``SchedulerOutput`` into a ``ModelRunnerOutput`` — by running a model
(``engine.worker.executor.TorchExecutor``) or by asking a cost model how long the step would take
and emitting placeholder tokens (``sim.executor.SimExecutor``). A ``CostModel`` sees only the
step's ``BatchShape`` and returns a ``StepTime`` with its breakdown, for reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.core.outputs import BatchShape, ModelRunnerOutput, SchedulerOutput


@dataclass(frozen=True, slots=True)
class StepTime:
    """How long one step takes on the device, and where that time goes (all in seconds)."""

    total_s: float  # the step's duration
    linear_s: float = 0.0  # QKV/O/MLP projections (+ LM head)
    attention_s: float = 0.0  # attention over the KV cache
    communication_s: float = 0.0  # tensor/pipeline-parallel collectives
    overhead_s: float = 0.0  # per-step and per-request fixed costs (launch, sampling, …)

    # Written out so mypyc compiles it (see engine/core/outputs.py's docstring).
    def __init__(
        self,
        total_s: float,
        linear_s: float = 0.0,
        attention_s: float = 0.0,
        communication_s: float = 0.0,
        overhead_s: float = 0.0,
    ) -> None:
        object.__setattr__(self, "total_s", total_s)
        object.__setattr__(self, "linear_s", linear_s)
        object.__setattr__(self, "attention_s", attention_s)
        object.__setattr__(self, "communication_s", communication_s)
        object.__setattr__(self, "overhead_s", overhead_s)


class CostModel(Protocol):
    """Predicts a step's device time from its batch shape alone."""

    def step_time(self, shape: BatchShape) -> StepTime: ...


class Executor(Protocol):
    """Runs (or simulates) one scheduled step and returns the sampled tokens."""

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput: ...
