"""The engine's batch queue under pipeline parallelism (vLLM's ``step_with_batch_queue`` with
``max_concurrent_batches`` = PP and a synchronous scheduler)."""

from __future__ import annotations

import pytest

from engine.core.config import ConfigError, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from tests.core.utils import create_requests


@pytest.mark.parametrize(
    ("pp", "async_scheduling", "depth"),
    [(1, False, 1), (1, True, 2), (2, False, 2), (4, False, 4), (8, False, 8)],
)
def test_queue_depth_is_vllms_max_concurrent_batches(
    pp: int, async_scheduling: bool, depth: int
) -> None:
    config = EngineConfig(
        scheduler=SchedulerConfig(async_scheduling=async_scheduling),
        pipeline_parallel_size=pp,
    )
    assert config.max_concurrent_batches == depth
    assert EngineCore(config).batch_queue_size == depth


def test_async_scheduling_with_pipeline_parallelism_is_refused() -> None:
    with pytest.raises(ConfigError, match="async scheduling is not supported with pipeline"):
        EngineConfig(scheduler=SchedulerConfig(async_scheduling=True), pipeline_parallel_size=2)
    with pytest.raises(ConfigError, match="pipeline_parallel_size must be a positive integer"):
        EngineConfig(pipeline_parallel_size=0)


def _sampled(out: SchedulerOutput) -> ModelRunnerOutput:
    return ModelRunnerOutput({
        r: [7] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids
    })


def test_four_stages_keep_four_batches_in_flight_and_never_a_request_twice() -> None:
    """With PP=4 the core schedules until four batches are in flight before it applies the
    oldest; a decoding request is in at most one of them (its next token is not known yet),
    while another request's prefill chunks fill the pipeline."""
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256),
        pipeline_parallel_size=4,
    )
    core = EngineCore(config)
    for request in create_requests(2, num_tokens=40, max_tokens=6):
        core.add_request(request, 0.0)
    in_flight: list[SchedulerOutput] = []
    max_in_flight = 0
    for _ in range(200):
        if not core.has_work():
            break
        assert core.find_bulk_run(7) is None  # pipeline engines run step by step
        out = core.begin_step(0.0)
        if out is not None:
            in_flight.append(out)
            scheduled = [r for o in in_flight for r in o.num_scheduled_tokens
                         if r not in o.partial_prefill_req_ids]
            assert len(scheduled) == len(set(scheduled)), "a request sampling twice in flight"
        max_in_flight = max(max_in_flight, core.num_in_flight)
        if core.must_finish_step():
            oldest = in_flight.pop(0)
            assert core.oldest_in_flight() is oldest
            core.finish_step(oldest, _sampled(oldest), 0.0)
    assert not core.has_work()
    assert max_in_flight == 4
