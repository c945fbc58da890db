"""Replayed steps and replayed front-end times (``sim/cost/replay.py``, ``APIServerPool``):
a simulation replaying another's step durations and front-end costs repeats it exactly."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from engine.core.config import EngineKnobs
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.config import SimConfig
from sim.cost.replay import ReplayCostModel
from sim.runtime import SimRuntime
from tests.sim.helpers import SIMPLE_FRONTEND, LinearCostModel, events, workload


@dataclass
class Recording:
    """A cost model that remembers every shape it priced, in order."""

    inner: LinearCostModel
    seen: list[tuple[BatchShape, float]] = field(default_factory=list)

    def step_time(self, shape: BatchShape) -> StepTime:
        t = self.inner.step_time(shape)
        if shape.num_tokens:
            self.seen.append((shape, t.total_s))
        return t


@dataclass
class Never:
    def step_time(self, shape: BatchShape) -> StepTime:
        raise AssertionError(f"the fallback was asked for {shape}")


def run(cost_model: object, frontend_s: list[float] | None = None):
    w = workload([0.0, 0.001, 0.004, 0.02, 0.021], [40, 12, 70, 33, 5], [6, 9, 3, 5, 8])
    cfg = SimConfig(engine=EngineKnobs(async_scheduling=False, max_num_batched_tokens=64),
                    frontend=SIMPLE_FRONTEND, num_gpu_blocks=1000, max_model_len=4096,
                    fast_path=False)
    return SimRuntime(cfg, workload=w, cost_model=cost_model,  # type: ignore[arg-type]
                      request_frontend_s=frontend_s).run()


def test_replaying_a_runs_own_steps_repeats_it_exactly() -> None:
    recorded = Recording(LinearCostModel(per_step_s=0.002, per_token_s=0.0001))
    original = run(recorded)
    replay = ReplayCostModel(recorded.seen, Never())
    again = run(replay)
    assert events(again) == events(original)
    assert replay.stats.replayed == len(recorded.seen) == replay.stats.total
    assert original.event_log.num_steps >= len(recorded.seen)


@dataclass(frozen=True)
class ByContext:
    """1 ms + 1 µs per cached context token of the decodes."""

    def step_time(self, shape: BatchShape) -> StepTime:
        return StepTime(0.001 + 1e-6 * shape.decode_context_sum)


def test_repeated_similar_and_unknown_shapes() -> None:
    a = BatchShape(1, 1, (), (), 1, 10, 10, 1)
    b = BatchShape(2, 2, (), (), 2, 20, 10, 2)
    replay = ReplayCostModel([(a, 1.0), (a, 3.0)], LinearCostModel(0.5, 0.0))
    assert [replay.step_time(a).total_s for _ in range(3)] == [1.0, 3.0, 2.0]
    assert replay.step_time(b).total_s == 0.5  # a kind never measured: the fallback
    assert (replay.stats.replayed, replay.stats.repeated, replay.stats.fallback) == (2, 1, 1)
    # a decode of a measured kind whose contexts differ: the kind's measured mean, moved by the
    # fallback model's ratio (here 1.1 ms / 1.01 ms predicted for 30 vs 10 context tokens)
    c = BatchShape(1, 1, (), (), 1, 110, 110, 1)
    similar = ReplayCostModel([(a, 0.002), (a, 0.004)], ByContext())
    assert similar.step_time(c).total_s == pytest.approx(0.003 * 0.00111 / 0.00101)
    assert similar.stats.similar == 1 and similar.stats.total == 1
    assert replay.step_time(BatchShape.empty()).total_s == 0.0
    with pytest.raises(ValueError, match=">= 0 s"):
        ReplayCostModel([(a, float("nan"))], Never())


def test_replayed_front_end_times() -> None:
    model = LinearCostModel(per_step_s=0.002, per_token_s=0.0001)
    configured = run(model, [SIMPLE_FRONTEND.request_overhead_s] * 5)
    assert events(configured) == events(run(model))  # the configured costs, given explicitly
    costs = [0.003, 0.0001, 0.002, 0.0005, 0.004]
    replayed = run(model, costs)
    ev = replayed.event_log.events_columns()
    kinds, times, req = (np.asarray(ev[k]) for k in ("kind", "time_s", "req_index"))
    for i, cost in enumerate(costs):
        start = times[(req == i) & (kinds == 1)][0]  # FRONTEND_START
        done = times[(req == i) & (kinds == 2)][0]  # TOKENIZED
        assert done - start == pytest.approx(cost)
    with pytest.raises(ValueError, match="one value per request"):
        run(model, [0.001])
