"""Async scheduling (vLLM's tests/v1/core/test_async_scheduler.py, SCHEDULER_SPEC §3 #70a–e, #76).

As in vLLM's tests, outputs are fed back one step late: step N+1 is scheduled before step N's
output is applied, and the i-th scheduled request samples token ``i``. The engine-core tests at
the end drive ``EngineCore``'s batch queue (depth 2) the way the golden replay does.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from tests.core.utils import (
    assert_scheduler_consistent,
    assert_scheduler_empty,
    create_requests,
    create_scheduler,
    index_output,
    make_request,
)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens(max_tokens: int) -> None:
    """#70a: nothing is over-scheduled; both requests end with exactly max_tokens outputs."""
    scheduler = create_scheduler(async_scheduling=True)
    req0, req1 = create_requests(num_requests=2, max_tokens=max_tokens)

    expected_total = 0
    sched_outputs: deque[SchedulerOutput] = deque()
    scheduler.add_request(req0)
    sched_outputs.append(scheduler.schedule())
    expected_total += req0.num_prompt_tokens + max_tokens - 1

    scheduler.add_request(req1)
    sched_outputs.append(scheduler.schedule())
    expected_total += req1.num_prompt_tokens + max_tokens - 1

    total = 0
    while sched_outputs:
        sched_output = sched_outputs.popleft()
        total += sched_output.total_num_scheduled_tokens
        scheduler.update_from_output(sched_output, index_output(sched_output))
        assert_scheduler_consistent(scheduler)
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)

    assert scheduler.get_num_unfinished_requests() == 0
    assert req0.num_output_tokens == max_tokens
    assert req1.num_output_tokens == max_tokens
    assert total == expected_total  # e.g. 28 for max_tokens=5
    assert req0.num_output_placeholders == req1.num_output_placeholders == 0
    scheduler.schedule()
    assert_scheduler_empty(scheduler)


def _abort_one_per_step(scheduler: Scheduler) -> list[Request]:
    requests = create_requests(num_requests=10, max_tokens=20)
    for request in requests:
        scheduler.add_request(request)
    sched_outputs: deque[SchedulerOutput] = deque()
    sched_outputs.append(scheduler.schedule())
    sched_outputs.append(scheduler.schedule())
    abort_order = [0, 8, 3, 1, 6, 4, 2, 5, 7, 9]
    pending = list(abort_order)
    while sched_outputs:
        if pending:  # abort a scheduled request, with its outputs still in flight
            req_id = requests[pending.pop(0)].req_id
            scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
        sched_output = sched_outputs.popleft()
        scheduler.update_from_output(sched_output, index_output(sched_output))
        assert_scheduler_consistent(scheduler)
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)
    for i, request in enumerate(requests):
        assert request.status == RequestStatus.FINISHED_ABORTED
        assert request.num_output_tokens == abort_order.index(i)
    return requests


def test_abort() -> None:
    """#70b: request i ends with as many outputs as its position in the abort order."""
    scheduler = create_scheduler(async_scheduling=True)
    _abort_one_per_step(scheduler)
    assert_scheduler_empty(scheduler)


def test_preempt() -> None:
    """#70b (vLLM's test_preempt is the same scenario), with the default block budget."""
    scheduler = create_scheduler(async_scheduling=True)
    requests = _abort_one_per_step(scheduler)
    assert all(not r.block_ids for r in requests)
    assert_scheduler_empty(scheduler)


def test_prefix_caching_for_prefill_dedup() -> None:
    """#70d: two identical 100-token prompts in the same step → 100 and 4 (100 mod 16)."""
    chunk_size, block_size, num_prompt_tokens = 1000, 16, 100
    scheduler = create_scheduler(
        async_scheduling=True,
        max_num_batched_tokens=chunk_size,
        enable_prefix_caching=True,
        block_size=block_size,
    )
    requests = create_requests(
        num_requests=5, num_tokens=num_prompt_tokens, max_tokens=3, same_prompt=True
    )
    req0, req1 = requests.pop(0), requests.pop(0)
    scheduler.add_request(req0)
    scheduler.add_request(req1)

    sched_outputs: deque[SchedulerOutput] = deque()
    sched_output = scheduler.schedule()
    sched_outputs.append(sched_output)
    assert sched_output.num_scheduled_tokens == {"0": 100, "1": 100 % block_size}
    assert [n.num_computed_tokens for n in sched_output.scheduled_new_reqs] == [0, 96]
    # Same-step sharing: req1's first 6 blocks are req0's, registered at allocation.
    assert req1.block_ids[:6] == req0.block_ids[:6]

    sched_outputs.append(scheduler.schedule())
    while sched_outputs:
        added = None
        if requests:
            added = requests.pop(0)
            scheduler.add_request(added)
        sched_output = sched_outputs.popleft()
        scheduler.update_from_output(sched_output, index_output(sched_output))
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)
            if added is not None:
                assert sched_output.num_scheduled_tokens[added.req_id] == 100 % block_size
    assert scheduler.get_num_unfinished_requests() == 0


def test_prefix_caching_for_multi_turn() -> None:
    """#70e: next-turn prompts (previous prompt + 200 outputs = 300 tokens) hit the whole
    conversation, generated tokens included: each is scheduled with 300 % 16 = 12 tokens."""
    chunk_size, block_size, num_prompt_tokens, num_output_tokens = 1000, 16, 100, 200
    scheduler = create_scheduler(
        async_scheduling=True,
        max_num_batched_tokens=chunk_size,
        enable_prefix_caching=True,
        block_size=block_size,
    )
    requests = create_requests(
        num_requests=5, num_tokens=num_prompt_tokens, max_tokens=num_output_tokens
    )
    for request in requests:
        scheduler.add_request(request)
    sched_outputs: deque[SchedulerOutput] = deque()
    sched_outputs.append(scheduler.schedule())
    sched_outputs.append(scheduler.schedule())
    while sched_outputs:
        sched_output = sched_outputs.popleft()
        scheduler.update_from_output(sched_output, index_output(sched_output))
        sched_output = scheduler.schedule()
        if sched_output.num_scheduled_tokens:
            sched_outputs.append(sched_output)
    assert scheduler.get_num_unfinished_requests() == 0
    assert all(r.num_output_tokens == num_output_tokens for r in requests)

    next_turn = [
        make_request(
            f"next-{i}",
            list(r.prompt_token_ids or []) + r.output_token_ids,
            max_tokens=num_output_tokens,
        )
        for i, r in enumerate(requests)
    ]
    for request in next_turn:
        scheduler.add_request(request)
    sched_output = scheduler.schedule()
    for request in next_turn:
        assert request.num_prompt_tokens == 300
        assert sched_output.num_scheduled_tokens[request.req_id] == 300 % block_size
    assert [n.num_computed_tokens for n in sched_output.scheduled_new_reqs] == [288] * 5


def test_async_placeholders_track_in_flight_outputs() -> None:
    """A step scheduled before the previous output is back carries a placeholder; a request is
    skipped once ``num_computed + 2 - placeholders >= num_prompt + max_tokens`` (its in-flight
    step already produces the last token)."""
    scheduler = create_scheduler(async_scheduling=True)
    (request,) = create_requests(num_requests=1, max_tokens=3)
    scheduler.add_request(request)
    out0 = scheduler.schedule()
    assert (request.num_computed_tokens, request.num_output_placeholders) == (10, 1)
    out1 = scheduler.schedule()  # the next decode, before out0's token is known
    assert out1.num_scheduled_tokens == {"0": 1}
    assert (request.num_computed_tokens, request.num_output_placeholders) == (11, 2)
    assert out1.scheduled_cached_reqs.num_output_tokens == [1]  # 0 real + 1 placeholder

    scheduler.update_from_output(out0, index_output(out0))
    assert (request.num_output_tokens, request.num_output_placeholders) == (1, 1)
    out2 = scheduler.schedule()  # 11 + 2 - 1 = 12 < 13
    assert out2.num_scheduled_tokens == {"0": 1}
    scheduler.update_from_output(out1, index_output(out1))
    out3 = scheduler.schedule()  # 12 + 2 - 1 = 13 >= 10 + 3: out2 brings the last token
    assert not out3.num_scheduled_tokens
    scheduler.update_from_output(out2, index_output(out2))
    assert request.output_token_ids == [0, 0, 0]
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert request.num_output_placeholders == 0


# -- through EngineCore's batch queue (the golden replay's step loop) ------------------------------


def _drive_engine_core(
    core: EngineCore, arrivals: dict[int, list[Request]], token_id: int = 7
) -> list[dict[str, Any]]:
    """One record per call of the engine's step loop, in the golden trace format."""
    pending_outputs: dict[int, ModelRunnerOutput] = {}
    records: list[dict[str, Any]] = []
    last_arrival = max(arrivals, default=-1)
    for step in range(1000):
        for request in arrivals.get(step, []):
            core.add_request(request, float(step))
        if step > last_arrival and not core.has_work():
            break
        record: dict[str, Any] = {"scheduled": {}, "new": {}}
        out = core.begin_step(float(step))
        if out is not None:
            pending_outputs[out.step_id] = ModelRunnerOutput(
                {
                    r: [token_id]
                    for r in out.num_scheduled_tokens
                    if r not in out.partial_prefill_req_ids
                }
            )
            record["scheduled"] = dict(out.num_scheduled_tokens)
            record["new"] = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
            record["preempted"] = sorted(out.preempted_req_ids)
            record["resumed"] = sorted(out.scheduled_cached_reqs.resumed_req_ids)
        finished: dict[str, str] = {}
        if core.must_finish_step():
            oldest = core.oldest_in_flight()
            for o in core.finish_step(oldest, pending_outputs.pop(oldest.step_id), float(step)):
                if o.finished:
                    finished[o.req_id] = str(o.finish_reason)
        record["finished"] = finished
        record["free_blocks"] = core.scheduler.kv_cache_manager.get_num_free_blocks()
        assert_scheduler_consistent(core.scheduler)
        records.append(record)
    return records


def _async_core(**cache_kwargs: Any) -> EngineCore:
    return EngineCore(
        EngineConfig(
            scheduler=SchedulerConfig(
                max_num_batched_tokens=8192, max_num_seqs=16, async_scheduling=True
            ),
            cache=CacheConfig(num_gpu_blocks=1000, **cache_kwargs),
        )
    )


def test_async_prefix_sharing_and_no_over_scheduling() -> None:
    """#76 (oracle-confirmed): s1 (50 × token 3, max_tokens 3) finishes with nothing
    over-scheduled; s2 (50 × 3) and s3 (32 × 3) arrive in the same step: s2 hits 48 and
    schedules 2, s3 hits 16 and schedules 16."""
    core = _async_core()
    s1 = make_request("s1", [3] * 50, max_tokens=3)
    s2 = make_request("s2", [3] * 50, max_tokens=3)
    s3 = make_request("s3", [3] * 32, max_tokens=3)
    records = _drive_engine_core(core, {0: [s1], 6: [s2, s3]})
    assert [r["scheduled"] for r in records] == [
        {"s1": 50}, {"s1": 1}, {"s1": 1}, {}, {}, {},
        {"s2": 2, "s3": 16}, {"s2": 1, "s3": 1}, {"s2": 1, "s3": 1}, {}, {}, {},
    ]
    assert records[6]["new"] == {"s2": 48, "s3": 16}
    assert records[3]["finished"] == {"s1": "length"}
    assert records[9]["finished"] == {"s2": "length", "s3": "length"}
    assert [r["free_blocks"] for r in records] == [
        995, 995, 995, 999, 999, 999, 994, 993, 993, 999, 999, 999
    ]
    assert_scheduler_empty(core.scheduler)


def test_async_preemption_delivers_the_in_flight_output_once() -> None:
    """Async + FCFS preemption (oracle-confirmed): B is preempted at step 6 while its step-5
    decode is in flight; that stale token is still delivered, and B resumes after A finishes
    recomputing 60 prompt + 5 output tokens, ending with exactly max_tokens outputs.

    Budget 100, B=16, 11 blocks, APC off, no full-sequence gate; A = 80 tokens (max_tokens 12)
    at step 0, B = 60 tokens (max_tokens 8) at step 1.
    """
    core = EngineCore(
        EngineConfig(
            scheduler=SchedulerConfig(
                max_num_batched_tokens=100, max_num_seqs=16, async_scheduling=True,
                scheduler_reserve_full_isl=False,
            ),
            cache=CacheConfig(num_gpu_blocks=11, enable_prefix_caching=False),
        )
    )
    a = make_request("A", [1000 + k for k in range(80)], max_tokens=12)
    b = make_request("B", [9000 + k for k in range(60)], max_tokens=8)
    records = _drive_engine_core(core, {0: [a], 1: [b]})
    assert [r["scheduled"] for r in records] == [
        {"A": 80}, {"A": 1, "B": 60}, {"A": 1, "B": 1}, {"A": 1, "B": 1}, {"A": 1, "B": 1},
        {"A": 1, "B": 1}, {"A": 1}, {"A": 1}, {"A": 1}, {"A": 1}, {"A": 1}, {"A": 1}, {},
        {"B": 65}, {"B": 1}, {"B": 1}, {}, {}, {},
    ]
    assert records[6]["preempted"] == ["B"] and records[13]["resumed"] == ["B"]
    assert records[12]["finished"] == {"A": "length"}
    assert records[16]["finished"] == {"B": "length"}
    assert [r["free_blocks"] for r in records][5:8] == [0, 4, 4]
    assert a.output_token_ids == [7] * 12 and b.output_token_ids == [7] * 8
    assert_scheduler_empty(core.scheduler)


def test_engine_core_batch_queue_depth() -> None:
    """Sync: every scheduled batch is applied at once; async: step N+1 is scheduled before
    step N's output is applied, and finish_step only accepts the oldest batch."""
    sync_core = EngineCore(EngineConfig(scheduler=SchedulerConfig(max_num_seqs=16)))
    sync_core.add_request(make_request("a", [1] * 10, max_tokens=2), 0.0)
    out = sync_core.begin_step(0.0)
    assert out is not None and sync_core.must_finish_step()

    core = _async_core()
    core.add_request(make_request("a", [1] * 10, max_tokens=2), 0.0)
    first = core.begin_step(0.0)
    assert first is not None and not core.must_finish_step() and core.num_in_flight == 1
    second = core.begin_step(1.0)
    assert second is not None and core.must_finish_step() and core.num_in_flight == 2
    assert core.oldest_in_flight() is first
    with pytest.raises(ValueError, match="oldest"):
        core.finish_step(second, ModelRunnerOutput({"a": [5]}), 1.0)
    core.finish_step(first, ModelRunnerOutput({"a": [5]}), 1.0)
    core.finish_step(second, ModelRunnerOutput({"a": [6]}), 2.0)
    assert core.num_in_flight == 0
    assert not core.scheduler.running  # max_tokens=2 reached


def test_async_abort_while_in_flight_drops_the_late_output() -> None:
    """An abort with outputs still in flight: the late outputs are ignored, nothing leaks."""
    core = _async_core()
    core.add_request(make_request("a", [1] * 40, max_tokens=50), 0.0)
    first = core.begin_step(0.0)
    second = core.begin_step(1.0)
    assert first is not None and second is not None
    (abort_out,) = core.abort_requests(["a"], 1.0)
    assert abort_out.finish_reason is not None and str(abort_out.finish_reason) == "abort"
    assert core.finish_step(first, ModelRunnerOutput({"a": [5]}), 2.0) == []
    assert core.finish_step(second, ModelRunnerOutput({"a": [6]}), 3.0) == []
    core.begin_step(4.0)  # ships the finished id
    assert_scheduler_empty(core.scheduler)
