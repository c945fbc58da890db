"""The worker side of the core contract: per-request state and the flattened batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core.outputs import (
    AdmissionBlocker,
    BatchShape,
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from engine.core.request import SamplingParams
from engine.worker.model_runner import build_attention_metadata
from engine.worker.request_state import RequestStates

CPU = torch.device("cpu")
PARAMS = SamplingParams(max_tokens=8, temperature=0.0)


def sched(step: int, num_scheduled: dict[str, int], *, new=(), cached=None, finished=(),
          preempted=(), partial=()) -> SchedulerOutput:
    return SchedulerOutput(
        step_id=step, scheduled_new_reqs=list(new),
        scheduled_cached_reqs=cached or CachedRequestData(),
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        partial_prefill_req_ids=set(partial), preempted_req_ids=set(preempted),
        finished_req_ids=set(finished), batch_shape=BatchShape.empty(),
        admission_blocker=AdmissionBlocker.NONE,
    )


def new_req(req_id: str, prompt: list[int], blocks: list[int], computed: int = 0):
    return NewRequestData(req_id, prompt, len(prompt), PARAMS, None, blocks, computed)


def test_attention_metadata_layout() -> None:
    """Two sequences: 3 tokens after 5 cached (block size 4), and a 2-token prefill."""
    positions, meta = build_attention_metadata(
        [[9, 4, 7], [2]], [5, 0], [3, 2], block_size=4, device=CPU
    )
    assert positions.tolist() == [5, 6, 7, 0, 1]
    assert meta.slot_mapping.tolist() == [4 * 4 + 1, 4 * 4 + 2, 4 * 4 + 3, 2 * 4, 2 * 4 + 1]
    assert meta.block_table.tolist() == [[9, 4], [2, 0]]  # only the blocks in use, 0-padded
    assert meta.seq_lens.tolist() == [8, 2]
    assert meta.query_start_loc.tolist() == [0, 3, 5]
    assert (meta.max_query_len, meta.max_seq_len) == (3, 8)
    assert meta.block_table.dtype == meta.seq_lens.dtype == torch.int32
    assert meta.slot_mapping.dtype == torch.int64


def test_request_states_follow_the_schedule() -> None:
    states = RequestStates(CPU)
    states.apply(sched(0, {"a": 4, "b": 3}, new=[new_req("a", [1, 2, 3, 4, 5], [3, 4]),
                                                new_req("b", [7, 8, 9], [5])],
                       partial={"a"}))
    assert states["a"].block_ids == [3, 4] and states["a"].num_computed_tokens == 0
    states.append_token("b", 42)  # the worker appends its own sample
    running = CachedRequestData(
        req_ids=["a", "b"], new_block_ids=[None, [6]], num_computed_tokens=[4, 3],
        num_output_tokens=[0, 1],
    )
    states.apply(sched(1, {"a": 1, "b": 1}, cached=running))
    assert states["b"].block_ids == [5, 6] and states["b"].token_ids == [7, 8, 9, 42]
    states.append_token("a", 43)  # a's prefill completed in step 1
    # b is preempted (state kept), then resumes with a fresh block table and the core's tokens.
    states.apply(sched(2, {"a": 1}, cached=CachedRequestData(["a"], set(), [None], [5], [1]),
                       preempted={"b"}))
    assert states["b"].token_ids == [7, 8, 9, 42]
    resumed = CachedRequestData(
        req_ids=["b"], resumed_req_ids={"b"}, new_block_ids=[[8, 1]], num_computed_tokens=[0],
        num_output_tokens=[1], all_token_ids={"b": [7, 8, 9, 42]},
    )
    states.apply(sched(3, {"b": 4}, cached=resumed, finished={"a", "never-seen"}))
    assert states["b"].block_ids == [8, 1] and states["b"].num_computed_tokens == 0
    assert len(states) == 1


def test_request_states_reject_inconsistent_schedules() -> None:
    states = RequestStates(CPU)
    with pytest.raises(RuntimeError, match="does not know"):
        states.apply(sched(0, {"x": 1}, cached=CachedRequestData(["x"], set(), [None], [0], [0])))
    with pytest.raises(RuntimeError, match="knows only"):
        states.apply(sched(0, {"a": 9}, new=[new_req("a", [1, 2, 3], [1])]))
    with pytest.raises(ValueError, match="no prompt token ids"):
        states.apply(sched(0, {"s": 1}, new=[NewRequestData("s", None, 3, PARAMS, None, [1], 0)]))


def test_min_tokens_bans_eos_and_stop_ids() -> None:
    states = RequestStates(CPU)
    params = SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(11,), seed=3)
    states.apply(sched(0, {"a": 2}, new=[NewRequestData("a", [1, 2], 2, params, 99, [1], 0)]))
    row = states["a"].row_sampling()
    assert set(row.banned_token_ids) == {99, 11} and row.generator is not None
    states.append_token("a", 5)
    states.append_token("a", 6)
    assert states["a"].row_sampling().banned_token_ids == ()


def test_executor_times_every_step(llama_dir: Path) -> None:
    from engine.llm import LLM

    llm = LLM(str(llama_dir), device="cpu", kv_cache_memory=1 << 20, block_size=4)
    llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=3, temperature=0.0))
    timings = llm.executor.step_timings
    assert [t.step_id for t in timings] == list(range(len(timings)))
    assert timings[0].batch_shape.prefill_query_lens == (5,)
    assert all(t.execute_time_s > 0 for t in timings)
    steps = llm.core.event_log.steps_columns()
    assert list(steps["cost_s"])[:3] == [t.execute_time_s for t in timings[:3]]
    assert llm.executor.num_gpu_blocks == (1 << 20) // llm.executor.kv_spec.bytes_per_block


def test_offline_run_writes_the_same_event_kinds_as_the_simulator(llama_dir: Path) -> None:
    from engine.core.events import EventKind
    from engine.llm import LLM

    llm = LLM(str(llama_dir), device="cpu", kv_cache_memory=1 << 20, block_size=4,
              async_scheduling=True)
    llm.generate([[1, 2, 3, 4, 5], [7, 8]], SamplingParams(max_tokens=3, temperature=0.0))
    log = llm.core.event_log
    kinds = [e.kind for e in log.iter_events() if e.req_id == "1"]
    assert kinds[:4] == [EventKind.ARRIVAL, EventKind.FRONTEND_START, EventKind.TOKENIZED,
                         EventKind.ENGINE_ENQUEUED]
    assert kinds.count(EventKind.TOKEN) == 3
    assert kinds[-2:] == [EventKind.FINISHED, EventKind.DELIVERED]
    arrival = next(e for e in log.iter_events() if e.kind == EventKind.ARRIVAL)
    assert arrival.payload == 5
    assert len(log.delivered_times()) >= 3  # every step with outputs was delivered


def test_profile_run_on_a_one_block_cache(llama_dir: Path) -> None:
    """The memory-profiling forward (used on CUDA) runs at the full budget without a real cache."""
    from engine.llm import LLM
    from engine.worker.kv_cache import allocate_kv_caches

    llm = LLM(str(llama_dir), device="cpu", kv_cache_memory=1 << 20, block_size=4)
    executor = llm.executor
    tiny = allocate_kv_caches(executor.kv_spec, 1, torch.device("cpu"))
    executor.runner.profile_run(num_tokens=37, num_seqs=5, kv_caches=tiny)
    assert all(int(k.abs().sum()) == 0 for k, _ in tiny)  # slots are -1: nothing written
