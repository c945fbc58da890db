"""The two seams between the core and the worlds around it: executors and cost models.

An ``Executor`` turns one ``SchedulerOutput`` into a ``ModelRunnerOutput`` by running a model
(``engine.worker.executor.TorchExecutor``). The simulated world has no model to run: its
``sim.executor.SimExecutor`` asks a cost model how long the step takes when the batch is
submitted, and emits placeholder tokens when the step is applied (the simulated GPU timeline
separates the two). A ``CostModel`` sees only the step's ``BatchShape`` and returns a
``StepTime`` with its breakdown, for reports; a ``DecodeStepCostModel`` also prices a
pure-decode step from three numbers, which the simulator's bulk decode runs call once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.core.outputs import BatchShape, ModelRunnerOutput, SchedulerOutput


@dataclass(frozen=True, slots=True)
class StepTime:
    """How long one step takes on the device, and where that time goes (all in seconds).

    ``host_s`` is the host (CPU) work the step needs before its first kernel can run (input
    preparation), ``launch_s`` the host time spent launching it; the simulated replica charges
    both on the engine's CPU timeline (0: a cost model that folds them into ``total_s``).
    ``terms`` names every kernel term of the step (``sim/cost/vllm_step.py``'s ``TERM_NAMES``);
    when present they sum to ``total_s``.
    """

    total_s: float  # the step's device duration
    linear_s: float = 0.0  # QKV/O/MLP projections (+ LM head)
    attention_s: float = 0.0  # attention over the KV cache
    communication_s: float = 0.0  # tensor/pipeline-parallel collectives
    overhead_s: float = 0.0  # per-step and per-request fixed costs (launch, sampling, …)
    host_s: float = 0.0  # host work before the first kernel (not part of total_s)
    launch_s: float = 0.0  # host time launching the step (overlaps total_s)
    terms: tuple[tuple[str, float], ...] = ()  # named breakdown of total_s

    # Written out so mypyc compiles it (see engine/core/outputs.py's docstring).
    def __init__(
        self,
        total_s: float,
        linear_s: float = 0.0,
        attention_s: float = 0.0,
        communication_s: float = 0.0,
        overhead_s: float = 0.0,
        host_s: float = 0.0,
        launch_s: float = 0.0,
        terms: tuple[tuple[str, float], ...] = (),
    ) -> None:
        object.__setattr__(self, "total_s", total_s)
        object.__setattr__(self, "linear_s", linear_s)
        object.__setattr__(self, "attention_s", attention_s)
        object.__setattr__(self, "communication_s", communication_s)
        object.__setattr__(self, "overhead_s", overhead_s)
        object.__setattr__(self, "host_s", host_s)
        object.__setattr__(self, "launch_s", launch_s)
        object.__setattr__(self, "terms", terms)


class CostModel(Protocol):
    """Predicts a step's device time from its batch shape alone."""

    def step_time(self, shape: BatchShape) -> StepTime: ...


class DecodeStepCostModel(CostModel, Protocol):
    """A cost model with a shortcut for pure-decode steps.

    Invariant: ``decode_step_total(n, ctx_sum, ctx_max)`` equals, bit for bit,
    ``step_time(shape).total_s`` of a step of ``n`` decodes whose cached contexts sum to
    ``ctx_sum`` (longest ``ctx_max``), and ``decode_step_host(n)`` its ``(host_s, launch_s)``
    (the simulator's bulk runs and its step-by-step path must time such a step identically). A
    cost model without them is priced through ``step_time``.
    """

    def decode_step_total(self, num_reqs: int, context_sum: int, context_max: int) -> float: ...

    def decode_step_host(self, num_reqs: int) -> tuple[float, float]: ...


class Executor(Protocol):
    """Runs (or simulates) one scheduled step and returns the sampled tokens."""

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput: ...
