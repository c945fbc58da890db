"""Small, hand-computable simulations: a linear cost model, simple front-end costs and
hand-built workloads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.config import EngineKnobs
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.config import FrontendConfig, SimConfig
from sim.runtime import SimResult, SimRuntime
from workload.stream import Workload


@dataclass(frozen=True)
class LinearCostModel:
    """step time = per_step_s + per_token_s × scheduled tokens (0 for an empty step)."""

    per_step_s: float = 0.01
    per_token_s: float = 0.001

    def step_time(self, shape: BatchShape) -> StepTime:
        if shape.num_tokens == 0:
            return StepTime(0.0)
        return StepTime(self.per_step_s + self.per_token_s * shape.num_tokens)


@dataclass(frozen=True)
class HostLinearCostModel(LinearCostModel):
    """``LinearCostModel`` whose steps also need ``host_s`` of host work before their first
    kernel and ``launch_s`` of launching."""

    host_s: float = 0.0
    launch_s: float = 0.0

    def step_time(self, shape: BatchShape) -> StepTime:
        if shape.num_tokens == 0:
            return StepTime(0.0)
        return StepTime(self.per_step_s + self.per_token_s * shape.num_tokens,
                        host_s=self.host_s, launch_s=self.launch_s)


#: Round-number costs so event times can be computed by hand.
SIMPLE_FRONTEND = FrontendConfig(
    num_api_servers=1,
    request_overhead_s=0.001,
    tokenize_s_per_token=0.0,
    ipc_latency_s=0.0005,
    detokenize_s_per_token=0.0,
    output_batch_overhead_s=0.0002,
    network_latency_s=0.0,
    schedule_overhead_s=0.0,
    schedule_s_per_request=0.0,
    update_overhead_s=0.0,
)


def workload(
    send_s: Sequence[float],
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    *,
    priorities: Sequence[int] | None = None,
    max_concurrency: int | None = None,
) -> Workload:
    n = len(send_s)
    return Workload(
        send_time_s=np.asarray(send_s, dtype=float),
        prompt_lens=np.asarray(prompt_lens, dtype=np.int64),
        output_lens=np.asarray(output_lens, dtype=np.int64),
        priorities=np.asarray(priorities if priorities is not None else [0] * n, dtype=np.int64),
        shared_prefix_ids=np.full(n, -1, dtype=np.int64),
        shared_prefix_lens=np.zeros(n, dtype=np.int64),
        max_concurrency=max_concurrency,
        source="hand-built",
    )


def simulate(
    w: Workload,
    *,
    engine: EngineKnobs | None = None,
    frontend: FrontendConfig = SIMPLE_FRONTEND,
    num_gpu_blocks: int | None = 1000,
    cost_model: object | None = None,
    fast_path: bool = True,
    max_model_len: int | None = 4096,
) -> SimResult:
    cfg = SimConfig(
        engine=engine or EngineKnobs(async_scheduling=False),
        frontend=frontend,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        fast_path=fast_path,
    )
    runtime = SimRuntime(
        cfg, workload=w, cost_model=cost_model if cost_model is not None else LinearCostModel()
    )
    return runtime.run()


def events(result: SimResult) -> list[tuple[str, str, float, object]]:
    """(req_id, kind name, time rounded to 1e-9 s, payload), in time order."""
    return [
        (e.req_id, e.kind.name, round(e.time_s, 9), e.payload)
        for e in result.event_log.iter_events()
    ]
