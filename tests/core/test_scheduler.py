"""vLLM's scheduler scenarios (SCHEDULER_SPEC §3, tests/v1/core/test_scheduler.py), FCFS policy.

Each test follows vLLM's own: schedule() → a hand-made ModelRunnerOutput → update_from_output()
→ assert the numbers of the spec. Scenario numbers refer to SCHEDULER_SPEC §3. Speculative
decoding, multimodal inputs, connectors, structured output and prompt logprobs are out of scope;
where vLLM parametrizes over one of those, the in-scope variant is tested. The oracle-confirmed
scenarios 73–75 are in test_scheduler_oracle.py; priority scenarios in
test_scheduler_priority.py; async ones in test_async_scheduler.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.scheduler import Scheduler
from tests.core.utils import (
    EOS_TOKEN_ID,
    assert_scheduler_consistent,
    assert_scheduler_empty,
    create_requests,
    create_scheduler,
    make_request,
    make_scheduler_output,
)

# -- 1–3: adding and finishing requests ----------------------------------------------------------


def test_add_requests() -> None:
    """#1: each added request is registered and waits."""
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for i, request in enumerate(requests):
        scheduler.add_request(request)
        assert request.req_id in scheduler.requests
        assert len(scheduler.waiting) == i + 1


def test_add_request_rejects_duplicate_id() -> None:
    scheduler = create_scheduler()
    scheduler.add_request(create_requests(1)[0])
    with pytest.raises(ValueError, match="duplicate request id"):
        scheduler.add_request(create_requests(1)[0])


def test_finish_request() -> None:
    """#2: aborting waiting requests one by one shrinks `waiting` 9, 8, …"""
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    for i, request in enumerate(requests):
        scheduler.finish_requests([request.req_id], RequestStatus.FINISHED_ABORTED)
        assert request.req_id not in scheduler.requests
        assert len(scheduler.waiting) == 9 - i
        assert request.status == RequestStatus.FINISHED_ABORTED
    # The ids are shipped to the workers with the next schedule().
    out = scheduler.schedule()
    assert out.finished_req_ids == {r.req_id for r in requests}
    assert not scheduler.schedule().finished_req_ids


def test_get_num_unfinished_requests() -> None:
    """#3"""
    scheduler = create_scheduler()
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    for i, request in enumerate(requests):
        scheduler.finish_requests([request.req_id], RequestStatus.FINISHED_STOPPED)
        assert scheduler.get_num_unfinished_requests() == len(requests) - i - 1


def test_finish_requests_ignores_unknown_and_finished_ids() -> None:
    scheduler = create_scheduler()
    req0, req1 = create_requests(2)
    scheduler.add_request(req0)
    scheduler.add_request(req1)
    scheduler.schedule()  # both RUNNING
    done = scheduler.finish_requests(["1", "nope", "1"], RequestStatus.FINISHED_ABORTED)
    assert done == [req1]
    assert scheduler.finish_requests(["1"], RequestStatus.FINISHED_ABORTED) == []
    assert scheduler.running == [req0]
    with pytest.raises(ValueError, match="not a finished status"):
        scheduler.finish_requests(["0"], RequestStatus.RUNNING)
    assert_scheduler_consistent(scheduler)


def test_finish_requests_accepts_a_single_id_like_vllm() -> None:
    scheduler = create_scheduler()
    requests = create_requests(11)  # ids "0" … "10"
    for request in requests:
        scheduler.add_request(request)
    done = scheduler.finish_requests("10", RequestStatus.FINISHED_ABORTED)
    assert [r.req_id for r in done] == ["10"]  # we abort "1" and "0" instead
    assert len(scheduler.waiting) == 10


def test_finish_requests_none_finishes_everything_like_vllm() -> None:
    scheduler = create_scheduler()
    for request in create_requests(3):
        scheduler.add_request(request)
    assert len(scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)) == 3  # type: ignore[arg-type]
    assert not scheduler.requests


# -- 4: the first step ---------------------------------------------------------------------------


@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_schedule(enable_prefix_caching: bool) -> None:
    """#4: ten 10-token requests are all admitted as new requests in the first step."""
    scheduler = create_scheduler(enable_prefix_caching=enable_prefix_caching)
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == len(requests)
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert len(output.finished_req_ids) == 0
    for req_id, num_tokens in output.num_scheduled_tokens.items():
        assert num_tokens == len(requests[int(req_id)].all_token_ids) == 10
    assert output.total_num_scheduled_tokens == 100
    assert len(scheduler.waiting) == 0
    assert scheduler.running == requests
    assert [n.req_id for n in output.scheduled_new_reqs] == [r.req_id for r in requests]
    # Each new request ships its whole block table (one block of 16) and no prefix hit.
    assert all(len(n.block_ids) == 1 and n.num_computed_tokens == 0
               for n in output.scheduled_new_reqs)
    assert all(r.status == RequestStatus.RUNNING and r.num_computed_tokens == 10
               for r in requests)
    assert output.batch_shape.prefill_query_lens == (10,) * 10
    assert output.partial_prefill_req_ids == set()


# -- 8: long-prefill threshold -------------------------------------------------------------------


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_schedule_concurrent_partial_requests(enable_prefix_caching: bool) -> None:
    """#8: budget 1024, threshold 400, 3×800 tokens → 400/400/224 twice, then 1/1/352."""
    scheduler = create_scheduler(
        max_num_batched_tokens=1024,
        long_prefill_token_threshold=400,
        enable_prefix_caching=enable_prefix_caching,
    )
    requests = create_requests(num_requests=3, num_tokens=800)
    for request in requests:
        scheduler.add_request(request)

    output = scheduler.schedule()
    assert len(output.scheduled_new_reqs) == 3
    assert output.scheduled_cached_reqs.num_reqs == 0
    assert len(output.finished_req_ids) == 0
    assert output.num_scheduled_tokens == {"0": 400, "1": 400, "2": 224}
    assert output.partial_prefill_req_ids == {"0", "1", "2"}
    scheduler.update_from_output(output, ModelRunnerOutput({r.req_id: [] for r in requests}))

    output1 = scheduler.schedule()
    assert len(scheduler.running) == 3
    assert len(output1.scheduled_new_reqs) == 0
    assert output1.scheduled_cached_reqs.num_reqs == 3
    assert len(output1.finished_req_ids) == 0
    assert output1.num_scheduled_tokens == {"0": 400, "1": 400, "2": 224}
    # r0 and r1 finished their prompts: they sample; r2 is still mid-prefill.
    assert output1.partial_prefill_req_ids == {"2"}
    scheduler.update_from_output(output1, ModelRunnerOutput({"0": [0], "1": [0], "2": []}))

    output2 = scheduler.schedule()
    assert len(scheduler.running) == 3
    assert len(output2.scheduled_new_reqs) == 0
    assert output2.scheduled_cached_reqs.num_reqs == 3
    assert len(output2.finished_req_ids) == 0
    assert output2.num_scheduled_tokens == {"0": 1, "1": 1, "2": 800 - 224 - 224}
    assert_scheduler_consistent(scheduler)


# -- 9–10: stopping ------------------------------------------------------------------------------


def _prefill(scheduler: Scheduler, requests: list[Request]) -> SchedulerOutput:
    """Admit ``requests`` and schedule their whole prompts; the output samples the first token."""
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert set(out.num_scheduled_tokens) == {r.req_id for r in requests}
    assert not out.partial_prefill_req_ids
    return out


def test_stop_via_update_from_output_eos() -> None:
    """#9a (one token per step): EOS stops its request; the other one keeps running."""
    scheduler = create_scheduler()
    req0, req1 = create_requests(num_requests=2, max_tokens=10)
    out = _prefill(scheduler, [req0, req1])
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"0": [EOS_TOKEN_ID], "1": [10]}))
    assert scheduler.running == [req1]
    assert req0.status == RequestStatus.FINISHED_STOPPED
    assert req0.stop_reason is None
    assert "0" in scheduler.finished_req_ids and "0" not in scheduler.requests
    assert req0.output_token_ids == [EOS_TOKEN_ID]
    assert req1.output_token_ids == [10]
    by_id = {o.req_id: o for o in outputs}
    assert by_id["0"].finish_reason == FinishReason.STOP and by_id["0"].new_token_ids == [
        EOS_TOKEN_ID
    ]
    assert by_id["1"].finish_reason is None and by_id["1"].new_token_ids == [10]
    assert_scheduler_consistent(scheduler)


def test_stop_via_update_from_output_stop_token() -> None:
    """#9b: a stop token ends the request with ``stop_reason`` = the token."""
    scheduler = create_scheduler()
    req0, req1 = create_requests(num_requests=2, max_tokens=10, stop_token_ids=[42, 43])
    out = _prefill(scheduler, [req0, req1])
    scheduler.update_from_output(out, ModelRunnerOutput({"0": [10], "1": [13]}))
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"0": [42], "1": [14]}))
    assert scheduler.running == [req1]
    assert req0.status == RequestStatus.FINISHED_STOPPED
    assert req0.stop_reason == 42
    assert req0.output_token_ids == [10, 42]
    assert req1.output_token_ids == [13, 14]
    (o0,) = [o for o in outputs if o.req_id == "0"]
    assert (o0.finish_reason, o0.stop_reason, o0.new_token_ids) == (FinishReason.STOP, 42, [42])


def test_stop_via_update_from_output_max_tokens() -> None:
    """#9c: the max_tokens-th output ends the request as LENGTH_CAPPED."""
    scheduler = create_scheduler()
    req0 = make_request("0", [0] * 10, max_tokens=2)
    req1 = make_request("1", [1] * 10, max_tokens=3)
    out = _prefill(scheduler, [req0, req1])
    scheduler.update_from_output(out, ModelRunnerOutput({"0": [10], "1": [13]}))
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"0": [11], "1": [14]}))
    assert scheduler.running == [req1]
    assert req0.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert req0.get_finished_reason() == FinishReason.LENGTH
    assert req0.output_token_ids == [10, 11]
    assert req1.output_token_ids == [13, 14]
    assert [o.finish_reason for o in outputs] == [FinishReason.LENGTH, None]


def test_stop_via_update_from_output_ignore_eos() -> None:
    """#9d: with ignore_eos, EOS is an ordinary token."""
    scheduler = create_scheduler()
    (req0,) = create_requests(num_requests=1, max_tokens=10, ignore_eos=True)
    assert req0.eos_token_id is None
    out = _prefill(scheduler, [req0])
    for token in (EOS_TOKEN_ID, 10, 11):
        outputs = scheduler.update_from_output(out, ModelRunnerOutput({"0": [token]}))
        assert not outputs[0].finished
        out = scheduler.schedule()
    assert scheduler.running == [req0]
    assert not req0.is_finished()
    assert req0.output_token_ids == [EOS_TOKEN_ID, 10, 11]


def _put_running(scheduler: Scheduler, requests: list[Request]) -> None:
    """vLLM's test set-up: requests put into RUNNING by hand, fully computed."""
    for request in requests:
        request.num_computed_tokens = request.num_tokens
        request.status = RequestStatus.RUNNING
        scheduler.requests[request.req_id] = request
        scheduler.running.append(request)


@pytest.mark.parametrize(
    ("kwargs", "sampled", "status", "stop_reason", "kept"),
    [
        # #9a–d exactly as vLLM's test (several tokens per step, as spec decode would return).
        ({}, ([EOS_TOKEN_ID], [10, 11]), RequestStatus.FINISHED_STOPPED, None,
         ([EOS_TOKEN_ID], [10, 11])),
        ({"stop_token_ids": [42, 43]}, ([10, 42, 12], [13, 14]), RequestStatus.FINISHED_STOPPED,
         42, ([10, 42], [13, 14])),
        ({"max_tokens": 2}, ([10, 11, 12], [13]), RequestStatus.FINISHED_LENGTH_CAPPED, None,
         ([10, 11], [13])),
    ],
    ids=["eos", "stop_token", "max_tokens"],
)
def test_stop_via_update_from_output_multi_token(
    kwargs: dict[str, Any],
    sampled: tuple[list[int], list[int]],
    status: RequestStatus,
    stop_reason: int | None,
    kept: tuple[list[int], list[int]],
) -> None:
    """#9: several sampled tokens in one step are appended one by one and cut at the stop."""
    scheduler = create_scheduler()
    kwargs = {"max_tokens": 10, **kwargs}
    requests = create_requests(num_requests=2, **kwargs)
    _put_running(scheduler, requests)
    sched_out = make_scheduler_output({"0": len(sampled[0]), "1": len(sampled[1])})
    outputs = scheduler.update_from_output(
        sched_out, ModelRunnerOutput({"0": list(sampled[0]), "1": list(sampled[1])})
    )
    assert scheduler.running == [requests[1]]
    assert requests[0].status == status
    assert requests[0].stop_reason == stop_reason
    assert "0" in scheduler.finished_req_ids
    assert requests[0].output_token_ids == kept[0]
    assert requests[1].output_token_ids == kept[1]
    assert outputs[0].new_token_ids == kept[0]  # the emitted tokens are trimmed too


def test_stop_via_update_from_output_multi_token_ignore_eos() -> None:
    """#9d as vLLM's test: [EOS, 10, 11] in one step, nothing stops."""
    scheduler = create_scheduler()
    (request,) = create_requests(num_requests=1, max_tokens=10, ignore_eos=True)
    _put_running(scheduler, [request])
    scheduler.update_from_output(
        make_scheduler_output({"0": 3}), ModelRunnerOutput({"0": [EOS_TOKEN_ID, 10, 11]})
    )
    assert scheduler.running == [request]
    assert not request.is_finished()
    assert request.output_token_ids == [EOS_TOKEN_ID, 10, 11]


def test_check_stop_order_of_vllm_0_33() -> None:
    """#10: 0.33.0's check_stop tests EOS and stop tokens *before* min_tokens.

    vLLM's stored ``test_check_stop_min_tokens`` expects no stop below min_tokens (the older
    order); the 0.33.0 code (and the oracle, see the next test) stops. A real sampler masks EOS
    and stop tokens until min_tokens is reached, so only scripted outputs see the difference.
    """
    max_model_len = 100
    request = make_request("0", [0, 1, 2], max_tokens=20, min_tokens=5)
    assert not request.append_sampled_token(10, max_model_len)
    assert not request.append_sampled_token(11, max_model_len)
    assert request.append_sampled_token(EOS_TOKEN_ID, max_model_len)  # below min_tokens
    assert request.status == RequestStatus.FINISHED_STOPPED

    # min_tokens reached: EOS stops (the older order agrees here).
    request = make_request("1", [0, 1, 2], max_tokens=20, min_tokens=5)
    for token in (10, 11, 12, 13, 14, 15, 16, 17):
        assert not request.append_sampled_token(token, max_model_len)
    assert request.append_sampled_token(EOS_TOKEN_ID, max_model_len)
    assert request.num_output_tokens == 9
    assert request.status == RequestStatus.FINISHED_STOPPED

    request = make_request("2", [0, 1, 2], max_tokens=20, min_tokens=0)
    assert not request.append_sampled_token(10, max_model_len)
    assert request.append_sampled_token(EOS_TOKEN_ID, max_model_len)
    assert request.status == RequestStatus.FINISHED_STOPPED

    # A stop token below min_tokens stops too, with stop_reason set.
    request = make_request("3", [0, 1, 2], max_tokens=20, min_tokens=5, stop_token_ids=[42])
    assert not request.append_sampled_token(10, max_model_len)
    assert not request.append_sampled_token(11, max_model_len)
    assert request.append_sampled_token(42, max_model_len)
    assert (request.status, request.stop_reason) == (RequestStatus.FINISHED_STOPPED, 42)

    # EOS is checked before the length cap: an EOS that is also the max_tokens-th token is "stop".
    request = make_request("4", [0, 1, 2], max_tokens=1)
    assert request.append_sampled_token(EOS_TOKEN_ID, max_model_len)
    assert request.get_finished_reason() == FinishReason.STOP

    # The length cap counts the whole sequence against max_model_len.
    request = make_request("5", list(range(8)), max_tokens=20)
    assert not request.append_sampled_token(1, max_model_len=10)
    assert request.append_sampled_token(1, max_model_len=10)
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_check_stop_through_the_scheduler() -> None:
    """#10 through update_from_output, numbers confirmed on the 0.33.0 oracle."""
    scheduler = create_scheduler()
    arrivals = {
        0: [
            make_request("eos", [0, 1, 2], max_tokens=20, min_tokens=5),
            make_request("stop", [0, 1, 2], max_tokens=20, min_tokens=5, stop_token_ids=[42]),
            make_request("ign", [0, 1, 2], max_tokens=4, ignore_eos=True),
            make_request("nomin", [0, 1, 2], max_tokens=20),
        ]
    }
    scripts = {
        "eos": [10, 11, EOS_TOKEN_ID],
        "stop": [10, 11, 42],
        "ign": [EOS_TOKEN_ID, 10, 11, EOS_TOKEN_ID],
        "nomin": [10, EOS_TOKEN_ID],
    }
    finished: dict[str, tuple[int, str]] = {}
    for step in range(10):
        for request in arrivals.get(step, []):
            scheduler.add_request(request)
        if not scheduler.has_requests():
            break
        out = scheduler.schedule()
        sampled = {
            r: [scripts[r][len(scheduler.requests[r].output_token_ids)]]
            for r in out.num_scheduled_tokens
            if r not in out.partial_prefill_req_ids
        }
        for o in scheduler.update_from_output(out, ModelRunnerOutput(sampled)):
            if o.finished:
                finished[o.req_id] = (step, str(o.finish_reason))
    assert finished == {
        "nomin": (1, "stop"),
        "eos": (2, "stop"),
        "stop": (2, "stop"),
        "ign": (3, "length"),
    }
    assert_scheduler_empty(scheduler)


# -- 11–13: batches in flight, ordering, preemption during execution -----------------------------


@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_schedule_concurrent_batches(enable_prefix_caching: bool) -> None:
    """#11: r1 is scheduled while r0's batch is in flight; r0 decodes once its output is back."""
    scheduler = create_scheduler(
        max_num_batched_tokens=1024, max_num_seqs=2, enable_prefix_caching=enable_prefix_caching
    )
    requests = create_requests(num_requests=2, num_tokens=512)

    scheduler.add_request(requests[0])
    out0 = scheduler.schedule()
    assert len(out0.scheduled_new_reqs) == 1
    assert out0.num_scheduled_tokens == {"0": 512}

    # r0 is still running (nothing left to compute before its output), so only r1 is scheduled.
    scheduler.add_request(requests[1])
    out1 = scheduler.schedule()
    assert len(out1.scheduled_new_reqs) == 1
    assert out1.num_scheduled_tokens == {"1": 512}

    scheduler.update_from_output(out0, ModelRunnerOutput({"0": [0]}))
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens == {"0": 1}

    scheduler.update_from_output(out1, ModelRunnerOutput({"1": [0]}))
    assert requests[1].output_token_ids == [0]
    assert_scheduler_consistent(scheduler)


@pytest.mark.parametrize("enable_chunked_prefill", [True, False])
def test_schedule_order(enable_chunked_prefill: bool) -> None:
    """#12: with chunked prefill off the waiting scan stops at the first prompt that does not
    fit: it never jumps ahead to the short requests behind it."""
    scheduler = create_scheduler(
        max_num_batched_tokens=1024, max_num_seqs=3, enable_chunked_prefill=enable_chunked_prefill
    )
    requests = create_requests(num_requests=2, num_tokens=800, req_ids=["1", "2"])
    requests += create_requests(num_requests=2, num_tokens=10, req_ids=["3", "4"])
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    if enable_chunked_prefill:
        assert len(out.scheduled_new_reqs) == 2
        assert out.num_scheduled_tokens == {"1": 800, "2": 224}
    else:
        assert len(out.scheduled_new_reqs) == 1
        assert out.num_scheduled_tokens == {"1": 800}
        assert [r.req_id for r in scheduler.waiting] == ["2", "3", "4"]
    assert str(out.admission_blocker) == "token_budget"


def test_preempt_during_execution() -> None:
    """#13: r1 is scheduled while r0 is in flight; r0's next step preempts r1, whose late output
    is still appended."""
    scheduler = create_scheduler(
        max_num_batched_tokens=100, block_size=16, num_blocks=11, enable_prefix_caching=False
    )
    requests = create_requests(num_requests=2, num_tokens=80, block_size=16)

    scheduler.add_request(requests[0])
    out0 = scheduler.schedule()
    assert len(out0.num_scheduled_tokens) == 1
    assert len(out0.scheduled_new_reqs[0].block_ids) == 5

    # 80 tokens are exactly 5 blocks, so r1 passes the full-sequence gate with 5 free.
    scheduler.add_request(requests[1])
    out1 = scheduler.schedule()
    assert len(out1.num_scheduled_tokens) == 1
    assert len(out1.scheduled_new_reqs[0].block_ids) == 5
    assert scheduler.kv_cache_manager.get_num_free_blocks() == 0

    scheduler.update_from_output(out0, ModelRunnerOutput({"0": [0]}))
    out2 = scheduler.schedule()  # r0 needs a 6th block: r1 (the last admitted) is preempted
    assert scheduler.running == [requests[0]]
    assert requests[1].status == RequestStatus.PREEMPTED
    assert out2.preempted_req_ids == {"1"}
    assert out2.num_scheduled_tokens == {"0": 1}
    assert list(scheduler.waiting) == [requests[1]]

    scheduler.update_from_output(out1, ModelRunnerOutput({"1": [42]}))
    assert requests[1].output_token_ids == [42]
    assert requests[1].status == RequestStatus.PREEMPTED
    assert_scheduler_consistent(scheduler)


# -- 14–16, 18: prefix-cache statistics and reset ------------------------------------------------


def _stats(scheduler: Scheduler) -> tuple[int, int, int]:
    s = scheduler.kv_cache_manager.prefix_cache_stats
    return (s.requests, s.queries, s.hits)


def test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#14: a hit rejected once by allocate_slots and admitted next step is counted once.

    Our stats accumulate over the scheduler's life (vLLM swaps in a fresh accumulator every
    step), so the test compares deltas.
    """
    block_size = 16
    scheduler = create_scheduler(enable_chunked_prefill=False, block_size=block_size)
    (seed,) = create_requests(
        1, block_size * 2, max_tokens=2, same_prompt=True, req_ids=["seed"]
    )
    scheduler.add_request(seed)
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        scheduler.update_from_output(out, ModelRunnerOutput({"seed": [1000]}))
    before = _stats(scheduler)

    (retried,) = create_requests(
        1, block_size * 3, max_tokens=1, same_prompt=True, req_ids=["retried"]
    )
    scheduler.add_request(retried)
    original = KVCacheManager.allocate_slots
    results: list[list[int] | None] = []

    def spy(self: KVCacheManager, *args: Any, **kwargs: Any) -> list[int] | None:
        result = None if not results else original(self, *args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(KVCacheManager, "allocate_slots", spy)
    assert not scheduler.schedule().scheduled_new_reqs
    assert _stats(scheduler) == before

    out = scheduler.schedule()
    assert "retried" in out.num_scheduled_tokens
    assert out.scheduled_new_reqs[0].num_computed_tokens == 32
    assert results[0] is None and results[1] is not None
    after = _stats(scheduler)
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (1, 48, 32)


def test_preemption_re_records_prefix_cache_query() -> None:
    """#15: a preempted request looks the cache up again on resume, counted as preempted; its
    stale in-flight output is drained."""
    scheduler = create_scheduler(enable_prefix_caching=True)
    (request,) = create_requests(num_requests=1)
    scheduler.add_request(request)
    out = scheduler.schedule()
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert (stats.requests, stats.preempted_requests) == (1, 0)

    scheduler.running.remove(request)
    scheduler._preempt_request(request)
    assert request.status == RequestStatus.PREEMPTED
    assert request.num_stale_output_tokens == 10

    scheduler.update_from_output(out, ModelRunnerOutput({"0": [1000]}))
    assert request.num_stale_output_tokens == 0
    assert request.output_token_ids == [1000]  # stale output is delivered, not dropped

    out = scheduler.schedule()
    assert request in scheduler.running and request.num_preemptions == 1
    assert out.scheduled_cached_reqs.resumed_req_ids == {"0"}
    assert out.num_scheduled_tokens == {"0": 11}  # 10 prompt tokens + the output, no full block
    assert (stats.requests, stats.preempted_requests, stats.preempted_queries) == (1, 1, 11)


def test_prefix_cache_stats_not_recorded_when_caching_disabled() -> None:
    """#16"""
    scheduler = create_scheduler(enable_prefix_caching=False)
    for request in create_requests(num_requests=2):
        scheduler.add_request(request)
    scheduler.schedule()
    assert _stats(scheduler) == (0, 0, 0)


def test_prefix_cache_stats_recorded_per_admission() -> None:
    scheduler = create_scheduler()
    for request in create_requests(2, 40, same_prompt=True):
        scheduler.add_request(request)
    scheduler.schedule()
    # The second request hits the 2 full blocks the first one registered in the same step.
    assert _stats(scheduler) == (2, 80, 32)


def test_scheduler_reset_prefix_cache() -> None:
    """#18: reset fails while requests hold blocks; with reset_running_requests every running
    request goes back to waiting, in order."""
    scheduler = create_scheduler(enable_prefix_caching=True)
    requests = create_requests(num_requests=10)
    for request in requests:
        scheduler.add_request(request)
    scheduler.schedule()
    assert len(scheduler.waiting) == 0
    assert scheduler.running == requests

    assert not scheduler.reset_prefix_cache()
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert len(scheduler.waiting) == len(requests)
    assert len(scheduler.running) == 0
    assert list(scheduler.waiting) == requests
    assert all(r.status == RequestStatus.PREEMPTED for r in requests)
    pool = scheduler.kv_cache_manager.block_pool
    assert not pool.hash_to_block
    assert all(h is None for h in pool.block_hash)
    assert_scheduler_consistent(scheduler)


# -- 26 (in-scope part): request counts ----------------------------------------------------------


def test_request_counts_after_a_budget_bound_step() -> None:
    """#26 without the blocked (grammar / remote KV) requests: budget 100, 3×50 tokens."""
    scheduler = create_scheduler(max_num_batched_tokens=100)
    for request in create_requests(num_requests=3, num_tokens=50):
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert len(out.scheduled_new_reqs) == 2
    assert scheduler.get_request_counts() == (2, 1)
    scheduler.update_from_output(out, ModelRunnerOutput({"0": [1], "1": [1]}))
    assert scheduler.get_request_counts() == (2, 1)


# -- 30: no leaks --------------------------------------------------------------------------------


def test_memory_leak() -> None:
    """#30: five requests run to the end leave no request, no queue entry and no held block."""
    scheduler = create_scheduler(enable_prefix_caching=True)
    requests = create_requests(num_requests=5, num_tokens=10, max_tokens=10)
    for request in requests:
        scheduler.add_request(request)
        out = scheduler.schedule()
        scheduler.update_from_output(
            out, ModelRunnerOutput({r.req_id: [1000] for r in scheduler.running})
        )
    while True:
        out = scheduler.schedule()
        if not scheduler.running:
            break
        scheduler.update_from_output(
            out, ModelRunnerOutput({r.req_id: [1000] for r in scheduler.running})
        )
        assert_scheduler_consistent(scheduler)
    assert all(r.num_output_tokens == 10 for r in requests)
    assert_scheduler_empty(scheduler)
