"""vLLM's priority-scheduling scenarios (SCHEDULER_SPEC §3 #31–42), in vLLM's test style.

vLLM's ``create_scheduler_with_priority`` turns prefix caching *off* by default; so does
``_priority_scheduler`` here. The waiting heap orders by (priority, arrival_time, req_id); the
preemption victim is ``max(running, key=(priority, arrival_time))``.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.queues import FCFSRequestQueue, PriorityRequestQueue, create_request_queue
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from tests.core.utils import (
    assert_scheduler_consistent,
    assert_scheduler_empty,
    create_requests,
    create_scheduler,
)


def _priority_scheduler(**kwargs: Any) -> Scheduler:
    kwargs.setdefault("enable_prefix_caching", False)
    return create_scheduler(policy="priority", **kwargs)


def _requests(
    priorities: list[int],
    arrival_times: list[float] | None = None,
    num_tokens: int = 10,
    **kwargs: Any,
) -> list[Request]:
    return create_requests(
        len(priorities),
        num_tokens,
        priorities=list(priorities),
        arrival_times=list(arrival_times) if arrival_times else None,
        **kwargs,
    )


def _new_ids(out: SchedulerOutput) -> list[str]:
    return [n.req_id for n in out.scheduled_new_reqs]


@pytest.mark.parametrize(
    ("priorities", "arrival_times", "expected"),
    [
        ([2, 0, 1], [1.0, 2.0, 3.0], ["1", "2", "0"]),  # #31 basic ordering
        ([1, 1, 1], [3.0, 1.0, 2.0], ["1", "2", "0"]),  # #32 arrival-time tie-breaker
        ([2, 1, 1, 0], [1.0, 3.0, 2.0, 4.0], ["3", "2", "1", "0"]),  # #33 mixed
        ([1, 1, 1, 1], [4.0, 1.0, 3.0, 2.0], ["1", "3", "2", "0"]),  # #39 FCFS fallback
    ],
    ids=["basic_ordering", "arrival_time_tiebreaker", "mixed_priority_and_arrival",
         "fcfs_fallback"],
)
def test_priority_scheduling_admission_order(
    priorities: list[int], arrival_times: list[float], expected: list[str]
) -> None:
    """#31, #32, #33, #39: everything fits; new requests come out in heap order."""
    scheduler = _priority_scheduler()
    for request in _requests(priorities, arrival_times):
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert _new_ids(out) == expected
    assert list(out.num_scheduled_tokens) == expected
    assert [r.req_id for r in scheduler.running] == expected


def test_priority_scheduling_preemption() -> None:
    """#34: under KV pressure the lowest-priority running request is preempted, even though it
    was already scheduled in this step (its tokens are refunded)."""
    block_size = 16
    scheduler = _priority_scheduler(
        max_num_seqs=3, max_num_batched_tokens=200, num_blocks=6, block_size=block_size
    )
    (lo1,) = _requests([5], [1.0], num_tokens=2 * block_size, req_ids=["lo1"])
    scheduler.add_request(lo1)
    out = scheduler.schedule()
    assert len(out.scheduled_new_reqs) == 1
    scheduler.update_from_output(out, ModelRunnerOutput({"lo1": [100]}))  # lo1: 33 tokens

    (hi1,) = _requests([0], [2.0], num_tokens=2 * block_size, req_ids=["hi1"])
    scheduler.add_request(hi1)
    out = scheduler.schedule()  # lo1 takes its 3rd block, hi1 is admitted with 2: 0 free
    assert _new_ids(out) == ["hi1"]
    assert out.num_scheduled_tokens == {"lo1": 1, "hi1": 32}
    assert len(scheduler.running) == 2
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 0
    scheduler.update_from_output(out, ModelRunnerOutput({"lo1": [101], "hi1": [100]}))

    # lo1 (34 tokens) is scheduled first; hi1 (33 tokens) needs a 3rd block with none free:
    # max(running, key=(priority, arrival)) is lo1, preempted and refunded.
    out = scheduler.schedule()
    assert lo1.status == RequestStatus.PREEMPTED
    assert scheduler.running == [hi1]
    assert out.preempted_req_ids == {"lo1"}
    assert out.num_scheduled_tokens == {"hi1": 1}
    assert out.total_num_scheduled_tokens == 1
    assert out.scheduled_cached_reqs.req_ids == ["hi1"]
    assert list(scheduler.waiting) == [lo1]
    assert lo1.num_computed_tokens == 0 and not lo1.block_ids
    assert_scheduler_consistent(scheduler)


def test_priority_scheduling_no_preemption_when_space_available() -> None:
    """#35"""
    scheduler = _priority_scheduler(max_num_seqs=3, max_num_batched_tokens=200)
    low = _requests([5, 5], [1.0, 2.0], num_tokens=30, req_ids=["lo1", "lo2"])
    for request in low:
        scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput({"lo1": [100], "lo2": [100]}))

    (high,) = _requests([0], [3.0], num_tokens=30, req_ids=["hi1"])
    scheduler.add_request(high)
    out = scheduler.schedule()
    assert _new_ids(out) == ["hi1"]
    assert not out.preempted_req_ids
    assert len(scheduler.running) == 3
    assert len(scheduler.waiting) == 0


@pytest.mark.parametrize(
    ("priorities", "arrival_times", "scheduled", "waiting"),
    [
        ([3, 2, 0], [1.0, 2.0, 3.0], ["2"], ["1", "0"]),  # #36 victim selection
        ([2, 2, 2], [3.0, 1.0, 2.0], ["1"], ["2", "0"]),  # #37 equal priority
        ([3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0], ["3"], ["1", "2", "0"]),  # #38 queue order
    ],
    ids=["preemption_victim_selection", "equal_priority_preemption", "waiting_queue_order"],
)
def test_priority_scheduling_one_slot(
    priorities: list[int], arrival_times: list[float], scheduled: list[str], waiting: list[str]
) -> None:
    """#36–38: max_num_seqs=1; the best request runs, the rest wait in heap order."""
    scheduler = _priority_scheduler(max_num_seqs=1)
    requests = _requests(priorities, arrival_times)
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert _new_ids(out) == scheduled
    assert [r.req_id for r in scheduler.waiting] == waiting
    assert [r.priority for r in scheduler.waiting] == [priorities[int(i)] for i in waiting]
    assert str(out.admission_blocker) == "max_num_seqs"


def test_priority_scheduling_with_limited_slots() -> None:
    """#40: max_num_seqs=2 → "3" and "1" run; "2", "0" wait."""
    scheduler = _priority_scheduler(max_num_seqs=2, max_num_batched_tokens=1000)
    for request in _requests([3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0]):
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert _new_ids(out) == ["3", "1"]
    assert [r.req_id for r in scheduler.waiting] == ["2", "0"]
    assert [r.priority for r in scheduler.waiting] == [2, 3]


def test_priority_scheduling_heap_property() -> None:
    """#41: one at a time, finishing each, the requests run in sorted priority order."""
    scheduler = _priority_scheduler(max_num_seqs=1)
    priorities = [5, 1, 8, 3, 2, 7, 4, 6]
    requests = _requests(priorities, [float(i) for i in range(len(priorities))])
    for request in requests:
        scheduler.add_request(request)
    scheduled: list[int] = []
    while scheduler.waiting:
        out = scheduler.schedule()
        (new,) = out.scheduled_new_reqs
        scheduled.append(requests[int(new.req_id)].priority)
        scheduler.update_from_output(out, ModelRunnerOutput({new.req_id: [100]}))
        scheduler.finish_requests([new.req_id], RequestStatus.FINISHED_STOPPED)
    assert scheduled == sorted(priorities)
    scheduler.schedule()
    assert_scheduler_empty(scheduler)


def test_priority_scheduling_preemption_and_resumption_when_out_of_kv() -> None:
    """#42 (without a KV connector): 5 blocks (4 usable), max_num_seqs=2."""
    scheduler = _priority_scheduler(
        max_num_seqs=2, max_num_batched_tokens=200, num_blocks=5, block_size=16
    )
    (low,) = _requests([1], [0.0], num_tokens=30)  # prompt [0]*30
    scheduler.add_request(low)
    out = scheduler.schedule()
    assert len(out.scheduled_new_reqs) == 1
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 1
    scheduler.update_from_output(out, ModelRunnerOutput({low.req_id: [100]}))

    # vLLM builds it with starting_idx=1: prompt [1]*32, id "1".
    (high,) = _requests([0], [1.0], num_tokens=32, req_ids=["1"], prompt_token_ids=[[1] * 32])
    scheduler.add_request(high)
    out = scheduler.schedule()
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 0
    assert len(out.scheduled_new_reqs) == 1
    assert out.scheduled_cached_reqs.num_reqs == 1
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 2
    scheduler.update_from_output(out, ModelRunnerOutput({"0": [100], "1": [100]}))

    # low needs 32 tokens = 2 blocks, high 33 = 3 blocks: no fit in 4, low is preempted.
    out = scheduler.schedule()
    assert len(out.scheduled_new_reqs) == 0
    assert out.scheduled_cached_reqs.num_reqs == 1
    assert out.scheduled_cached_reqs.req_ids == ["1"]
    assert low.status == RequestStatus.PREEMPTED
    assert len(scheduler.waiting) == 1 and len(scheduler.running) == 1

    scheduler.update_from_output(out, ModelRunnerOutput({"0": [], "1": [100]}))
    scheduler.finish_requests(["1"], RequestStatus.FINISHED_STOPPED)

    out = scheduler.schedule()
    cached = out.scheduled_cached_reqs
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 1
    assert len(out.scheduled_new_reqs) == 0
    assert cached.num_reqs == 1
    assert cached.req_ids == ["0"]
    assert cached.resumed_req_ids == {"0"}
    assert set(cached.all_token_ids) == {"0"}
    # 30 prompt tokens and 2 decoded ones are recomputed.
    assert len(cached.all_token_ids["0"]) == 32
    assert cached.all_token_ids["0"][31] == 100
    assert out.num_scheduled_tokens == {"0": 32}
    assert_scheduler_consistent(scheduler)


def test_priority_preempts_the_latest_arrival_among_equal_priorities() -> None:
    """Victim = max (priority, arrival_time): on a priority tie the latest arrival goes."""
    scheduler = _priority_scheduler(max_num_seqs=3, num_blocks=5, block_size=16)
    reqs = _requests([1, 1, 1], [2.0, 1.0, 3.0], num_tokens=16)
    for request in reqs:
        scheduler.add_request(request)
    out = scheduler.schedule()  # 3 blocks used, 1 free; admission order "1", "0", "2"
    assert _new_ids(out) == ["1", "0", "2"]
    scheduler.update_from_output(out, ModelRunnerOutput({r.req_id: [7] for r in reqs}))
    out = scheduler.schedule()  # everyone needs a 2nd block; only one is free
    assert out.num_scheduled_tokens == {"1": 1, "0": 1}
    assert out.preempted_req_ids == {"2"}  # arrival 3.0
    assert_scheduler_consistent(scheduler)


# -- the queues themselves -----------------------------------------------------------------------


def test_priority_queue_orders_by_priority_arrival_then_id() -> None:
    queue = PriorityRequestQueue()
    reqs = _requests([1, 0, 1, 1], [2.0, 5.0, 1.0, 1.0], req_ids=["b", "z", "c", "a"])
    for request in reqs:
        queue.add_request(request)
    assert [r.req_id for r in queue] == ["z", "a", "c", "b"]
    assert [r.req_id for r in queue] == ["z", "a", "c", "b"]  # iteration does not consume
    assert queue.peek_request().req_id == "z"
    queue.remove_requests([reqs[2]])
    assert [r.req_id for r in queue] == ["z", "a", "b"]
    queue.prepend_requests([reqs[2]])  # a heap push: back in sorted place, not at the front
    assert [queue.pop_request().req_id for _ in range(4)] == ["z", "a", "c", "b"]
    assert not queue
    with pytest.raises(IndexError):
        queue.pop_request()
    with pytest.raises(IndexError):
        queue.peek_request()


def test_fcfs_queue_prepend_requests_reverses_like_extendleft() -> None:
    queue = FCFSRequestQueue()
    a, b, c, d = _requests([0, 0, 0, 0])
    queue.add_request(a)
    queue.prepend_request(b)
    assert list(queue) == [b, a]
    queue.prepend_requests([c, d])  # extendleft: d ends up first
    assert list(queue) == [d, c, b, a]
    queue.remove_requests([c, a])
    assert list(queue) == [d, b]
    assert queue.pop_request() is d and queue.peek_request() is b and len(queue) == 1


def test_create_request_queue_rejects_unknown_policy() -> None:
    assert isinstance(create_request_queue("fcfs"), FCFSRequestQueue)
    assert isinstance(create_request_queue("priority"), PriorityRequestQueue)
    with pytest.raises(ValueError, match="lifo"):
        create_request_queue("lifo")
