"""Hand-computable scenarios for each shipped scheduling policy, in vLLM's test style.

Each test builds a scheduler with a policy, adds requests, calls ``schedule()`` and
``update_from_output()`` by hand and asserts who goes first, who gets the budget, who is
preempted and who is shed — with the same scenario under vLLM's FCFS beside it where the two
differ, so each assertion shows the policy's own decision.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.hashing import TokenBlockHasher
from engine.core.outputs import AdmissionBlocker, SchedulerOutput
from engine.core.policy import PolicyContext, RequestLengths, StreamInfo, build_policy
from engine.core.request import Request, RequestStatus, SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.slo import SLOClass
from engine.policies.predictors import BucketPredictor
from tests.core.utils import assert_scheduler_consistent, sample_all

TIGHT = SLOClass("tight", ttft_s=1.0, tpot_s=0.1)
LOOSE = SLOClass("loose", ttft_s=10.0, tpot_s=1.0)


def scheduler(
    policy: str,
    *,
    options: dict[str, Any] | None = None,
    budget: int = 64,
    max_num_seqs: int = 8,
    num_blocks: int = 100,
    block_size: int = 4,
    stream: StreamInfo | None = None,
    long_prefill: int = 0,
) -> Scheduler:
    sc = SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=256,
        policy=policy, policy_options=options or {}, scheduler_reserve_full_isl=False,
        long_prefill_token_threshold=long_prefill,
    )
    config = EngineConfig(sc, CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size))
    return Scheduler(config, policy=build_policy(PolicyContext(sc, stream or StreamInfo())))


def request(
    req_id: str,
    prompt_len: int,
    max_tokens: int,
    *,
    arrival: float = 0.0,
    tenant: str = "",
    slo: SLOClass | None = None,
    block_size: int = 4,
) -> Request:
    return Request(
        req_id,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        prompt_token_ids=[100 + 50 * (sum(map(ord, req_id)) % 20) + k for k in range(prompt_len)],
        arrival_time=arrival,
        tenant=tenant,
        slo=slo,
        block_hasher=TokenBlockHasher(block_size),
    )


def step(sched: Scheduler, now_s: float = 0.0) -> SchedulerOutput:
    out = sched.schedule(now_s)
    sched.update_from_output(out, sample_all(out, 7))
    assert_scheduler_consistent(sched)
    return out


def admission_order(sched: Scheduler, requests: list[Request]) -> list[str]:
    """Add every request, run to completion; the order requests were first scheduled in."""
    for r in requests:
        sched.add_request(r)
    order: list[str] = []
    for _ in range(500):
        if not sched.has_unfinished_requests():
            return order
        out = step(sched)
        order.extend(n.req_id for n in out.scheduled_new_reqs)
    raise AssertionError("did not finish")


# -- sjf: who goes first ---------------------------------------------------------------------------
def test_sjf_admits_the_shortest_known_output_first() -> None:
    def three() -> list[Request]:
        return [request("a", 8, 30), request("b", 8, 5, arrival=1), request("c", 8, 10, arrival=2)]

    assert admission_order(scheduler("fcfs", max_num_seqs=1), three()) == ["a", "b", "c"]
    assert admission_order(scheduler("sjf", max_num_seqs=1), three()) == ["b", "c", "a"]


def test_sjf_with_a_bucket_predictor_follows_its_prediction_not_the_truth() -> None:
    # fitted on a trace where short prompts had long outputs: two buckets, prompt <= 10
    # predicts median 50 tokens, prompt 100 predicts 2; so y (prompt 100, truly 40 tokens)
    # goes before x (prompt 10, truly 3), where the oracle would take x first
    lengths = RequestLengths([10, 10, 100, 100], [50, 50, 2, 2])
    stream = StreamInfo(lengths=lengths)
    bucket = scheduler("sjf", max_num_seqs=1, stream=stream,
                       options={"predictor": "bucket", "num_buckets": 2})
    oracle = scheduler("sjf", max_num_seqs=1)
    assert admission_order(bucket, [request("x", 10, 3), request("y", 100, 40)]) == ["y", "x"]
    assert admission_order(oracle, [request("x", 10, 3), request("y", 100, 40)]) == ["x", "y"]
    predictor = BucketPredictor(lengths, 2)
    assert predictor.edges == [10] and predictor.medians == [50.0, 2.0]


def test_noisy_oracle_is_the_oracle_times_a_seeded_log_normal_error() -> None:
    sched = scheduler("sjf", options={"predictor": "noisy", "noise_sigma": 0.5},
                      stream=StreamInfo(seed=3))
    predictor = sched.policy.predictor  # type: ignore[attr-defined]
    r = request("q", 8, 40)
    z = random.Random("3/q").gauss(0.0, 1.0)
    assert predictor.predict(r) == pytest.approx(40 * math.exp(0.5 * z))
    again = scheduler("sjf", options={"predictor": "noisy", "noise_sigma": 0.5},
                      stream=StreamInfo(seed=3)).policy.predictor  # type: ignore[attr-defined]
    assert again.predict(request("q", 8, 40)) == predictor.predict(r)
    exact = scheduler("sjf", options={"predictor": "noisy", "noise_sigma": 0.0})
    assert exact.policy.predictor.predict(r) == 40.0  # type: ignore[attr-defined]


# -- srpt: who is preempted ------------------------------------------------------------------------
def _two_decoders_then_a_kv_shortage(policy: str) -> SchedulerOutput:
    """Blocks of 4 tokens, 3 usable. Step 1: A prefills its 4-token prompt (a block). Step 2:
    A's first decode takes a second block, B (arrived meanwhile) is admitted into the third.
    Step 3: A's next slot is in its second block, B's first decode needs a new one: none is
    free, a victim must go."""
    sched = scheduler(policy, num_blocks=4)
    sched.add_request(request("A", 4, 20))
    step(sched)
    sched.add_request(request("B", 4, 4, arrival=0.5))
    assert step(sched).num_scheduled_tokens == {"A": 1, "B": 4}
    assert sched.kv_cache_manager.get_num_free_blocks() == 0
    return step(sched)


def test_fcfs_preempts_the_last_admitted() -> None:
    out = _two_decoders_then_a_kv_shortage("fcfs")
    assert out.preempted_req_ids == {"B"} and out.num_scheduled_tokens == {"A": 1}


def test_srpt_preempts_the_most_remaining_output() -> None:
    # A has 18 tokens left, B 3: A goes (its scheduled token is refunded), B takes its block
    out = _two_decoders_then_a_kv_shortage("srpt")
    assert out.preempted_req_ids == {"A"} and out.num_scheduled_tokens == {"B": 1}


def test_srpt_queues_a_preempted_request_by_what_it_has_left() -> None:
    sched = scheduler("srpt", max_num_seqs=1)
    long, short = request("long", 8, 30), request("short", 8, 12, arrival=1)
    long.append_output_tokens(7, 25)  # (as if it had run: 5 tokens left)
    sched.add_request(short)
    sched.add_request(long)
    assert sched.waiting.peek_request() is long


# -- edf: who goes first, who gets the budget, who is preempted ----------------------------------
def test_edf_admits_the_earliest_first_token_deadline() -> None:
    def two() -> list[Request]:  # L due at 0 + 10 s, T at 1 + 1 s
        return [request("L", 8, 3, slo=LOOSE), request("T", 8, 3, arrival=1.0, slo=TIGHT)]

    assert admission_order(scheduler("fcfs", max_num_seqs=1), two()) == ["L", "T"]
    assert admission_order(scheduler("edf", max_num_seqs=1), two()) == ["T", "L"]


@pytest.mark.parametrize("policy,expected", [
    ("fcfs", {"L": 1, "T": 9}),  # admission order: L decodes, T takes the rest
    ("edf", {"T": 10}),  # T's first token is due at 2 s, L's next at 11 s: T first, L stalls
])
def test_edf_gives_the_budget_to_the_earliest_deadline_first(
    policy: str, expected: dict[str, int]
) -> None:
    sched = scheduler(policy, budget=10, block_size=16)
    sched.add_request(request("L", 20, 5, slo=LOOSE, block_size=16))
    assert step(sched).num_scheduled_tokens == {"L": 10}
    sched.add_request(request("T", 30, 5, arrival=1.0, slo=TIGHT, block_size=16))
    assert step(sched).num_scheduled_tokens == {"L": 10}  # L's prompt done; the budget too
    assert step(sched).num_scheduled_tokens == {"L": 1, "T": 9}  # T admitted after L's decode
    assert step(sched).num_scheduled_tokens == expected


def test_edf_preempts_the_latest_deadline() -> None:
    # T (tight) is admitted first, then L: both need a second block, one is free; in deadline
    # order T takes it and L, the latest deadline, is preempted (FCFS would admit L first and
    # preempt T, the last admitted)
    for policy, victim in (("fcfs", "T"), ("edf", "L")):
        sched = scheduler(policy, num_blocks=4)
        sched.add_request(request("L", 4, 20, slo=LOOSE))
        sched.add_request(request("T", 4, 20, arrival=0.5, slo=TIGHT))
        step(sched)
        assert step(sched).preempted_req_ids == {victim}


# -- vtc: who goes first -------------------------------------------------------------------------
def test_vtc_admits_from_the_least_served_tenant() -> None:
    # x sends three requests, then y one. x1 goes first (counters tie at 0: x was seen first);
    # it is served 10 prompt tokens + 2 outputs = 10·1 + 2·2 = 14; y (0) goes next, then x.
    def four() -> list[Request]:
        return [request(f"x{i}", 10, 2, tenant="x") for i in (1, 2, 3)] + [
            request("y1", 10, 2, tenant="y")
        ]

    assert admission_order(scheduler("fcfs", max_num_seqs=1), four()) == ["x1", "x2", "x3", "y1"]
    assert admission_order(scheduler("vtc", max_num_seqs=1), four()) == ["x1", "y1", "x2", "x3"]


def test_vtc_lifts_a_newly_backlogged_tenant_to_the_least_served_backlogged_one() -> None:
    sched = scheduler("vtc", max_num_seqs=1)
    for i in (1, 2, 3):
        sched.add_request(request(f"x{i}", 10, 2, tenant="x"))
    order: list[str] = []
    while len(order) < 2:  # x1 served 10 + 2·2 = 14, x2 so far 10 + 2·1: x's counter is 26
        order.extend(n.req_id for n in step(sched).scheduled_new_reqs)
    counters = sched.policy.counters  # type: ignore[attr-defined]
    assert order == ["x1", "x2"] and counters.counter("x") == 26
    for i in (1, 2, 3):
        sched.add_request(request(f"y{i}", 10, 2, tenant="y"))
    assert counters.counter("y") == 26  # lifted from 0 to x's 26
    while sched.has_unfinished_requests():
        order.extend(n.req_id for n in step(sched).scheduled_new_reqs)
    # x2 ends at 28 > 26: y1 (y: 26 + 14 = 40), then x3 (28 < 40; x: 42), y2, y3. Without the
    # lift y would start at 0 and take y1 and y2 (0, then 14 < 28) before x3.
    assert order == ["x1", "x2", "y1", "x3", "y2", "y3"]


# -- decode-first / prefill-first: who gets the budget --------------------------------------------
@pytest.mark.parametrize("policy,expected", [
    ("fcfs", {"D": 1, "P": 7}),
    ("decode-first", {"D": 1, "P": 7}),
    ("prefill-first", {"P": 8}),  # P's chunk takes the whole budget: D's decode stalls
])
def test_who_gets_the_budget_when_a_decode_and_a_prefill_run(
    policy: str, expected: dict[str, int]
) -> None:
    options = {"chunk": 8} if policy != "fcfs" else {}
    sched = scheduler(policy, budget=8, options=options, block_size=16)
    sched.add_request(request("D", 4, 10, block_size=16))
    assert step(sched).num_scheduled_tokens == {"D": 4}
    sched.add_request(request("P", 40, 10, block_size=16))
    assert step(sched).num_scheduled_tokens == {"D": 1, "P": 7}  # P admitted after D
    assert step(sched).num_scheduled_tokens == expected


def test_decode_first_puts_decodes_before_an_earlier_prefill() -> None:
    # P (long prompt, chunks of 4) was admitted before D; once D decodes, decode-first moves
    # it ahead of P, so D's token never waits for P's chunk (FCFS keeps P first)
    for policy, first in (("fcfs", "P"), ("decode-first", "D")):
        sched = scheduler(policy, budget=8, options={"chunk": 4} if policy != "fcfs" else {},
                          long_prefill=4 if policy == "fcfs" else 0)
        sched.add_request(request("P", 40, 5))
        sched.add_request(request("D", 2, 5))
        step(sched)
        out = step(sched)
        assert next(iter(out.num_scheduled_tokens)) == first


def test_sarathi_chunks_even_a_lone_prefill() -> None:
    # vLLM's threshold applies only while more than one request is unfinished; the fixed chunk
    # always does
    sched = scheduler("decode-first", options={"chunk": 8})
    sched.add_request(request("P", 20, 3))
    assert step(sched).num_scheduled_tokens == {"P": 8}


# -- shed: who is shed ---------------------------------------------------------------------------
def test_shed_rejects_the_head_whose_predicted_ttft_exceeds_its_slo() -> None:
    # R (no SLO) runs from t = 0; the steps at t = 0 and t = 1 make the step time 1 s. A and B
    # arrive at 1.5 with 30-token prompts; a step gives one of them 10 − 1 (R's decode) = 9
    # tokens, so 4 steps: predicted TTFT at t = 2 is 0.5 + 4 × 1 = 4.5 s. A's SLO is 2 s (shed),
    # B's 10 s (admitted).
    sched = scheduler("shed", budget=10, block_size=16)
    sched.add_request(request("R", 4, 50, block_size=16))
    step(sched, 0.0)
    step(sched, 1.0)
    assert sched.step_time_s == 1.0
    a = request("A", 30, 5, arrival=1.5, slo=SLOClass("chat", 2.0, 0.1), block_size=16)
    b = request("B", 30, 5, arrival=1.5, slo=SLOClass("batch", 10.0, 1.0), block_size=16)
    sched.add_request(a)
    sched.add_request(b)
    out = step(sched, 2.0)
    assert out.rejected == {"A": "shed: predicted TTFT 4500 ms > 2000 ms (SLO class chat)"}
    assert [n.req_id for n in out.scheduled_new_reqs] == ["B"]
    assert a.status == RequestStatus.FINISHED_ABORTED and "A" not in sched.requests
    assert "A" in out.finished_req_ids or "A" in step(sched, 3.0).finished_req_ids


def test_shed_never_rejects_what_fcfs_would_admit_when_the_slo_holds() -> None:
    sched = scheduler("shed", options={"slack": 2.0}, budget=10, block_size=16)
    sched.add_request(request("R", 4, 50, block_size=16))
    step(sched, 0.0)
    step(sched, 1.0)
    # predicted 4.5 s against 2 × 2.5 s = 5 s: admitted
    sched.add_request(request("A", 30, 5, arrival=1.5, slo=SLOClass("chat", 2.5, 0.1),
                              block_size=16))
    out = step(sched, 2.0)
    assert out.rejected is None and [n.req_id for n in out.scheduled_new_reqs] == ["A"]


def test_a_policy_that_waits_blocks_admissions_with_the_policy_blocker() -> None:
    from engine.core.policy import WAIT, AdmissionView, VllmPolicy

    class Hold(VllmPolicy):
        def admit(self, request: Request, view: AdmissionView) -> Any:
            return WAIT

    sc = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    sched = Scheduler(EngineConfig(sc, CacheConfig(num_gpu_blocks=50, block_size=4)),
                      policy=Hold(PolicyContext(sc)))
    sched.add_request(request("a", 8, 2))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {} and out.admission_blocker == AdmissionBlocker.POLICY


def test_an_engine_whose_policy_holds_everyone_back_idles_until_its_next_input() -> None:
    from engine.core.engine_core import EngineCore
    from engine.core.policy import WAIT, AdmissionView, VllmPolicy

    class HoldUntilTwo(VllmPolicy):
        def admit(self, request: Request, view: AdmissionView) -> Any:
            from engine.core.policy import ADMIT

            return WAIT if view.now_s < 2.0 else ADMIT

    sc = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    core = EngineCore(EngineConfig(sc, CacheConfig(num_gpu_blocks=50, block_size=4)),
                      policy=HoldUntilTwo(PolicyContext(sc)))
    core.add_request(request("a", 8, 2), 0.0)
    out = core.begin_step(1.0)
    assert out is not None and out.admission_blocker == AdmissionBlocker.POLICY
    core.finish_step(out, sample_all(out), 1.0)
    # nothing runs, the policy waits: no work (a driver idles) until the next input
    assert not core.has_work() and core.held_by_policy
    core.add_request(request("b", 8, 2, arrival=2.5), 2.5)
    assert core.has_work() and not core.held_by_policy
    out = core.begin_step(2.5)
    assert out is not None and set(out.num_scheduled_tokens) == {"a", "b"}
