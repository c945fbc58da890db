"""Oracle-confirmed vLLM 0.33.0 behaviours (SCHEDULER_SPEC §3 #73–75), step by step.

Each set-up below was re-run on the real vLLM 0.33.0 scheduler (shared/tools/vllm-oracle) and the
numbers asserted here are its decisions: ``run_steps`` drives the scheduler like the oracle's
synchronous replay loop (every request that completes its prefill samples token 7).
"""

from __future__ import annotations

import pytest

from engine.core.scheduler import Scheduler
from tests.core.utils import assert_scheduler_empty, create_scheduler, make_request, run_steps

# -- 73–75: oracle-confirmed 0.33.0 behaviours ---------------------------------------------------


def _prompt(i: int, n: int) -> list[int]:
    """Distinct tokens per request (no accidental prefix sharing), like the oracle's prompt_len."""
    return [1000 + i * 7919 + k for k in range(n)]


def test_long_prefill_cap_skipped_for_a_lone_request() -> None:
    """#73: budget 1024, threshold 400: a lone 800-token request is prefilled in one step."""
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    records = run_steps(scheduler, {0: [make_request("0", _prompt(0, 800), max_tokens=2)]})
    # The last (empty) step only ships the finished id to the workers, as in the oracle.
    assert [r["scheduled"] for r in records] == [{"0": 800}, {"0": 1}, {}]
    assert records[1]["finished"] == {"0": "length"}


def test_long_prefill_cap_applies_with_two_requests() -> None:
    scheduler = create_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    scheduler.add_request(make_request("0", _prompt(0, 800)))
    scheduler.add_request(make_request("1", _prompt(1, 100)))
    assert scheduler.schedule().num_scheduled_tokens == {"0": 400, "1": 100}


def test_chunked_prefill_order_and_decode_first() -> None:
    """#74: budget 100, three 60-token requests (max_tokens 3); 1000 blocks as on the oracle."""
    scheduler = create_scheduler(max_num_batched_tokens=100, num_blocks=1000)
    arrivals = {0: [make_request(str(i), _prompt(i, 60), max_tokens=3) for i in range(3)]}
    records = run_steps(scheduler, arrivals)
    assert [r["scheduled"] for r in records] == [
        {"0": 60, "1": 40},
        {"0": 1, "1": 20, "2": 60},
        {"0": 1, "1": 1, "2": 1},
        {"1": 1, "2": 1},
        {},
    ]
    assert records[2]["finished"] == {"0": "length"}
    assert records[3]["finished"] == {"1": "length", "2": "length"}
    assert [r["free_blocks"] for r in records] == [992, 987, 991, 999, 999]
    assert_scheduler_empty(scheduler)


def _full_isl_scheduler(*, reserve_full_isl: bool, prefix_caching: bool) -> Scheduler:
    return create_scheduler(
        max_num_batched_tokens=100,
        num_blocks=11,
        enable_prefix_caching=prefix_caching,
        scheduler_reserve_full_isl=reserve_full_isl,
        max_model_len=8192,
    )


def test_full_isl_gate_holds_back_admission() -> None:
    """#75a: B (70 tokens: 5 blocks) is not admitted while only 4 are free; nothing is preempted.

    Oracle set-up: budget 100, B=16, 11 blocks, APC off; A = 80 tokens (max_tokens 48) at
    step 0, B = 70 tokens (max_tokens 16) at step 1.
    """
    scheduler = _full_isl_scheduler(reserve_full_isl=True, prefix_caching=False)
    a = make_request("A", _prompt(0, 80), max_tokens=48)
    b = make_request("B", _prompt(1, 70), max_tokens=16)
    records = run_steps(scheduler, {0: [a], 1: [b]})
    assert records[0]["scheduled"] == {"A": 80} and records[0]["free_blocks"] == 5
    for r in records[1:48]:
        assert r["scheduled"] == {"A": 1} and not r["preempted"]
    assert records[1]["free_blocks"] == 4  # A took its 6th block; B needs 5
    assert records[47]["finished"] == {"A": "length"}
    assert records[48]["scheduled"] == {"B": 70} and records[48]["new"] == {"B": 0}
    assert records[63]["finished"] == {"B": "length"}
    assert len(records) == 65 and records[64]["scheduled"] == {}  # reports B's finish
    assert not any(r["preempted"] for r in records)
    assert_scheduler_empty(scheduler)


@pytest.mark.parametrize(
    ("prefix_caching", "resume_tokens", "resume_finish_step"),
    [(False, 65, 58), (True, 33, 58)],
    ids=["apc_off", "apc_on"],
)
def test_without_full_isl_gate_fcfs_preempts_the_latest(
    prefix_caching: bool, resume_tokens: int, resume_finish_step: int
) -> None:
    """#75b/c: without the gate B (60 tokens) is admitted at step 1; at step 6 A needs a block and
    FCFS preempts B (the last running request). B resumes when A finishes: recomputing 60
    prompt + 5 output tokens with APC off, or with a 32-token hit on its surviving cached
    blocks (A's later growth evicted the two deepest) and 33 tokens with APC on."""
    scheduler = _full_isl_scheduler(reserve_full_isl=False, prefix_caching=prefix_caching)
    a = make_request("A", _prompt(0, 80), max_tokens=48)
    b = make_request("B", _prompt(1, 60), max_tokens=16)
    records = run_steps(scheduler, {0: [a], 1: [b]})
    assert records[0]["scheduled"] == {"A": 80}
    assert records[1]["scheduled"] == {"A": 1, "B": 60} and records[1]["free_blocks"] == 0
    for r in records[2:6]:
        assert r["scheduled"] == {"A": 1, "B": 1}
    assert records[6]["scheduled"] == {"A": 1}
    assert records[6]["preempted"] == ["B"] and records[6]["free_blocks"] == 4
    assert records[6]["running"] == ["A"]
    assert records[47]["finished"] == {"A": "length"}
    assert records[48]["scheduled"] == {"B": resume_tokens}
    assert records[48]["resumed"] == ["B"] and records[48]["free_blocks"] == 5
    assert records[resume_finish_step]["finished"] == {"B": "length"}
    assert [r["preempted"] for r in records].count(["B"]) == 1
    assert all(r["preempted"] in ([], ["B"]) for r in records)
    assert_scheduler_empty(scheduler)
