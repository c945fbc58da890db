"""``SimExecutor``: the simulated world's executor — placeholder tokens, cost-model timing.

Every request that completes its prefill samples ``PLACEHOLDER_TOKEN_ID``; simulated requests
carry no EOS and no stop tokens, so each ends exactly at its workload output length (as
``ignore_eos`` benchmarks do). The step's duration comes from the cost model.
"""

from __future__ import annotations

from typing import Final

from engine.core.interfaces import CostModel, StepTime
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput

#: The token every simulated request samples (never an EOS or stop token of a sim request).
PLACEHOLDER_TOKEN_ID: Final = 0


class SimExecutor:
    """Implements ``engine.core.interfaces.Executor`` with a cost model instead of a GPU."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model

    def step_time(self, sched_out: SchedulerOutput) -> StepTime:
        if sched_out.total_num_scheduled_tokens == 0:
            return StepTime(total_s=0.0)
        return self.cost_model.step_time(sched_out.batch_shape)

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        partial = sched_out.partial_prefill_req_ids
        token = [PLACEHOLDER_TOKEN_ID]
        sampled = {r: token for r in sched_out.num_scheduled_tokens if r not in partial}
        return ModelRunnerOutput(sampled, execute_time_s=self.step_time(sched_out).total_s)
