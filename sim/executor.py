"""``SimExecutor``: the simulated world's executor, the replica's one seam to the cost model.

A simulated step has no model to run. When a batch is submitted the replica asks how long it
takes (``step_time``; ``decode_time_s`` and ``decode_host_s`` for the pure-decode steps of a
bulk run, ``shape_time`` for any other shape a bulk run predicts), and when the step is
applied it takes the step's sampled tokens (``sampled``): every request that completes its
prefill samples ``PLACEHOLDER_TOKEN_ID``. Simulated requests carry no EOS and no stop tokens,
so each ends exactly at its workload output length (as ``ignore_eos`` benchmarks do).

The cost model needs only ``step_time`` (``engine.core.interfaces.CostModel``); one that also
implements ``DecodeStepCostModel`` prices decode steps through its shortcut (bit-identical by
that protocol's contract), others through ``step_time`` on the decode step's shape.
"""

from __future__ import annotations

from typing import Final, Protocol, cast

from engine.core.interfaces import CostModel, DecodeStepCostModel, StepTime
from engine.core.outputs import BatchShape, ModelRunnerOutput, SchedulerOutput
from sim.cost.pipeline import PipelineStepTime

#: The token every simulated request samples (never an EOS or stop token of a sim request).
PLACEHOLDER_TOKEN_ID: Final = 0


class StagedCostModel(CostModel, Protocol):
    """A cost model of a pipeline-parallel replica (``sim.cost.pipeline``)."""

    def stage_times(self, shape: BatchShape) -> PipelineStepTime: ...


class SimExecutor:
    """Step times from a cost model and placeholder samples, for one simulated replica."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        # structurally a DecodeStepCostModel? (the check runtime_checkable would make; the
        # compiled build cannot make its protocols runtime-checkable)
        self._decode: DecodeStepCostModel | None = (
            cast(DecodeStepCostModel, cost_model)
            if callable(getattr(cost_model, "decode_step_total", None))
            else None
        )
        # a pipeline-parallel cost model: each stage's time and the sends between them
        self._pipeline: StagedCostModel | None = (
            cast(StagedCostModel, cost_model)
            if callable(getattr(cost_model, "stage_times", None))
            else None
        )

    @property
    def pipelined(self) -> bool:
        return self._pipeline is not None

    def stage_times(self, sched_out: SchedulerOutput) -> PipelineStepTime | None:
        """The step on each pipeline stage, when the cost model prices stages (else None)."""
        if self._pipeline is None:
            return None
        return self._pipeline.stage_times(sched_out.batch_shape)

    def step_time(self, sched_out: SchedulerOutput) -> StepTime:
        """Device time of a scheduled step (0 for an empty one)."""
        if sched_out.total_num_scheduled_tokens == 0:
            return StepTime(total_s=0.0)
        return self.cost_model.step_time(sched_out.batch_shape)

    def shape_time(self, shape: BatchShape) -> StepTime:
        """Time of a step of this shape (device and host)."""
        return self.cost_model.step_time(shape)

    def decode_time_s(self, num_reqs: int, context_sum: int, context_max: int) -> float:
        """Device time of a step of ``num_reqs`` decodes whose cached contexts sum to
        ``context_sum`` (longest ``context_max``)."""
        if self._decode is not None:
            return float(self._decode.decode_step_total(num_reqs, context_sum, context_max))
        return self.cost_model.step_time(_decode_shape(num_reqs, context_sum, context_max)).total_s

    def decode_host_s(self, num_reqs: int) -> tuple[float, float]:
        """(``host_s``, ``launch_s``) of a step of ``num_reqs`` decodes (see ``StepTime``);
        they do not depend on the contexts."""
        if self._decode is not None:
            return self._decode.decode_step_host(num_reqs)
        step = self.cost_model.step_time(_decode_shape(num_reqs, 0, 0))
        return step.host_s, step.launch_s

    @staticmethod
    def sampled(sched_out: SchedulerOutput, execute_time_s: float) -> ModelRunnerOutput:
        """The step's output: one placeholder token per request that samples this step."""
        token = [PLACEHOLDER_TOKEN_ID]
        sampled = dict.fromkeys(sched_out.num_scheduled_tokens, token)  # (in their order)
        for r in sched_out.partial_prefill_req_ids:
            sampled.pop(r, None)
        return ModelRunnerOutput(sampled, execute_time_s=execute_time_s)


def _decode_shape(num_reqs: int, context_sum: int, context_max: int) -> BatchShape:
    """The batch shape of a step of ``num_reqs`` decodes (each samples one token)."""
    return BatchShape(num_reqs, num_reqs, (), (), num_reqs, context_sum, context_max, num_reqs)
