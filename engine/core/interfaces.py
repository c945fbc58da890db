"""The two seams between the core and the worlds around it: executors and cost models.

An ``Executor`` turns one ``SchedulerOutput`` into a ``ModelRunnerOutput`` by running a model
(``engine.worker.executor.TorchExecutor``). The simulated world has no model to run: its
``sim.executor.SimExecutor`` asks a cost model how long the step takes when the batch is
submitted, and emits placeholder tokens when the step is applied (the simulated GPU timeline
separates the two). A ``CostModel`` sees only the step's ``BatchShape`` and returns a
``StepTime`` with its breakdown, for reports; a ``DecodeStepCostModel`` also prices a
pure-decode step from two numbers, which the simulator's bulk decode runs call once per step.
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


class DecodeStepCostModel(CostModel, Protocol):
    """A cost model with a shortcut for pure-decode steps.

    Invariant: ``decode_step_total(n, ctx)`` equals, bit for bit, ``step_time(shape).total_s``
    of a step of ``n`` decodes whose cached contexts sum to ``ctx`` (the simulator's bulk runs
    and its step-by-step path must time such a step identically). A cost model without it is
    priced through ``step_time``.
    """

    def decode_step_total(self, num_reqs: int, context_sum: int) -> float: ...


class Executor(Protocol):
    """Runs (or simulates) one scheduled step and returns the sampled tokens."""

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput: ...
