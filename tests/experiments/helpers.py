"""Shared pieces of the experiment-layer tests: a tiny workload and a synthetic cost model
whose capacity is known in closed form."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.config import FrontendConfig

#: A fast, valid workload: 40 short random requests.
TINY_WORKLOAD: dict[str, Any] = {
    "dataset_name": "random", "num_prompts": 40, "random_input_len": 128,
    "random_output_len": 16, "request_rate": 10.0,
}

#: Every front-end, IPC and scheduler CPU cost zero: only the cost model takes time.
ZERO_FRONTEND: dict[str, float] = {
    f.name: 0.0 for f in dataclasses.fields(FrontendConfig) if f.name != "num_api_servers"
}


@dataclass(frozen=True)
class ConstantStepCostModel:
    """Every non-empty step takes ``step_s``, whatever the batch."""

    step_s: float

    def step_time(self, shape: BatchShape) -> StepTime:
        return StepTime(self.step_s if shape.num_tokens else 0.0)


def analytic_base(num_prompts: int, output_len: int, router: str = "round_robin") -> dict[str, Any]:
    """One request at a time (max_num_seqs 1), constant prompt/output lengths, evenly spaced
    arrivals (burstiness inf) and no front-end costs: a D/D/1 queue per replica with service
    time output_len × step_s (one prefill step, then output_len − 1 decode steps)."""
    return {
        "num_gpu_blocks": 1000, "max_model_len": 64, "router": router,
        "engine": {"max_num_seqs": 1, "max_num_batched_tokens": 64},
        "frontend": dict(ZERO_FRONTEND),
        "workload": {"dataset_name": "random", "num_prompts": num_prompts,
                     "random_input_len": 16, "random_output_len": output_len,
                     "burstiness": math.inf},
    }


def analytic_capacity(step_s: float, output_len: int, num_prompts: int, ttft_slo_s: float,
                      attainment: float) -> float:
    """The highest evenly spaced rate λ at which ≥ ``attainment`` of ``num_prompts`` requests
    meet TTFT ≤ ``ttft_slo_s`` on one replica.

    Service time S = output_len · step_s; request k (from 0) waits k · (S − 1/λ) when λ > 1/S
    and its TTFT is that wait plus one step. It meets the SLO iff k ≤ (T − step_s)/(S − 1/λ);
    the first m + 1 requests must, with m = ceil(attainment · N) − 1, so
    λ* = 1 / (S − (T − step_s) / m)."""
    service = output_len * step_s
    m = math.ceil(attainment * num_prompts) - 1
    return 1.0 / (service - (ttft_slo_s - step_s) / m)
