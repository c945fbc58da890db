"""Hypothesis properties of every shipped scheduling policy: whatever the policy decides, the
scheduler keeps the KV invariants (no leak, no double free, ref counts = holders), never
schedules past the token budget or ``max_num_seqs``, and every request ends.

Random configurations, arrivals, tenants, SLO classes (tight ones, so ``shed`` sheds), aborts
and tight KV caches (so preemption happens), sync and async, driven through ``EngineCore`` as
the golden replay drives it (``test_properties.py``'s driver and checks), then drained: every
block is free again. Plus the policies' own queues against a list model.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from engine.core.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.hashing import TokenBlockHasher
from engine.core.policy import PolicyContext, RequestLengths, StreamInfo, build_policy
from engine.core.request import Request, RequestStatus, SamplingParams
from engine.core.slo import SLOClass
from engine.policies.fair_share import TenantCounters, VirtualTokenCounterQueue
from engine.policies.keyed_queue import KeyedRequestQueue
from tests.core.test_properties import (
    BS,
    EOS,
    MAX_MODEL_LEN,
    PHASES,
    _engine_config,
    _EngineDriver,
    _prompt,
    request_specs,
)
from tests.core.utils import assert_scheduler_consistent, assert_scheduler_empty

SLOS = [SLOClass("tight", 2.0, 0.5), SLOClass("loose", 30.0, 5.0), None]
TENANTS = ["a", "b", "c"]
#: Every shipped policy, with options that exercise its variants.
POLICIES: list[tuple[str, dict[str, Any]]] = [
    ("sjf", {}),
    ("sjf", {"predictor": "bucket", "num_buckets": 3}),
    ("sjf", {"predictor": "noisy"}),
    ("srpt", {}),
    ("srpt", {"predictor": "noisy", "noise_sigma": 1.0}),
    ("edf", {}),
    ("vtc", {}),
    ("vtc", {"input_weight": 0.0, "output_weight": 1.0}),
    ("decode-first", {"chunk": 5}),
    ("prefill-first", {"chunk": 7}),
    ("shed", {}),
    ("shed", {"slack": 0.5}),
]
FIT = RequestLengths([3, 10, 20, 30, 40, 45], [12, 9, 5, 3, 2, 1])


class _PolicyDriver(_EngineDriver):
    """``test_properties``' driver with a policy, tenants and SLO classes."""

    def __init__(self, config: EngineConfig, rng: random.Random) -> None:
        stream = StreamInfo(seed=1, lengths=FIT, has_slos=True)
        self.core = EngineCore(config, policy=build_policy(PolicyContext(config.scheduler,
                                                                         stream)))
        self.pending = {}
        self.now = 0.0
        self.counter = 0
        self.hasher = TokenBlockHasher(BS)
        self.all_requests = {}
        self.rng = rng
        self.aborted: set[str] = set()

    def add(self, prompt: list[int], max_tokens: int, priority: int, ignore_eos: bool) -> None:
        self.counter += 1
        request = Request(
            f"r{self.counter}",
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
            prompt_token_ids=prompt, arrival_time=self.now, priority=priority,
            eos_token_id=EOS, block_hasher=self.hasher,
            tenant=self.rng.choice(TENANTS), slo=self.rng.choice(SLOS),
        )
        self.all_requests[request.req_id] = request
        self.core.add_request(request, self.now)

    def maybe_abort(self) -> None:
        live = sorted(self.scheduler.requests)
        if live and self.rng.random() < 0.15:
            req_id = self.rng.choice(live)
            self.core.abort_requests([req_id], self.now)
            self.aborted.add(req_id)


@pytest.mark.parametrize("policy,options", POLICIES, ids=[
    f"{p}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for p, o in POLICIES
])
@settings(max_examples=40, deadline=None, derandomize=True, database=None, phases=PHASES)
@given(data=st.data(), specs=request_specs, async_scheduling=st.booleans(), seed=st.integers(0, 99))
def test_every_policy_keeps_the_kv_invariants_and_the_budgets(
    policy: str, options: dict[str, Any], data: st.DataObject, specs: list[tuple[Any, ...]],
    async_scheduling: bool, seed: int,
) -> None:
    config = _engine_config(data.draw, async_scheduling)
    config = dataclasses.replace(config, scheduler=dataclasses.replace(
        config.scheduler, policy=policy, policy_options=options))
    rng = random.Random(seed)
    driver = _PolicyDriver(config, rng)
    by_step: dict[int, list[tuple[Any, ...]]] = {}
    for spec in specs:
        by_step.setdefault(spec[5], []).append(spec)
    for s in range(8):
        for prefix, prefix_len, suffix, max_tokens, priority, _ in by_step.get(s, []):
            prompt = _prompt(prefix, prefix_len, suffix)[: MAX_MODEL_LEN - 1] or [5]
            driver.add(prompt, max_tokens, priority, ignore_eos=rng.random() < 0.5)
        driver.step(rng)  # (checks the budget, max_num_seqs and the output: check_schedule)
        assert_scheduler_consistent(driver.scheduler)
        driver.maybe_abort()
        assert_scheduler_consistent(driver.scheduler)
    driver.drain()
    assert_scheduler_empty(driver.scheduler)
    shed = driver.core.rejected_reasons
    for request in driver.all_requests.values():
        assert request.is_finished() and not request.block_ids
        reason = str(request.get_finished_reason())
        if request.req_id in shed or request.req_id in driver.aborted:
            assert reason == "abort"
        else:
            assert reason in ("stop", "length")
            assert request.num_output_tokens <= request.max_tokens
    if policy != "shed":
        assert not shed


# -- the policies' queues against a list model ----------------------------------------------------
queue_ops = st.lists(
    st.tuples(st.sampled_from(["add", "pop", "prepend", "remove"]), st.integers(0, 30),
              st.integers(1, 40)),
    max_size=60,
)


def _request(i: int, prompt_len: int, tenant: str = "") -> Request:
    return Request(str(i), sampling_params=SamplingParams(max_tokens=prompt_len % 7 + 1),
                   num_prompt_tokens=prompt_len, tenant=tenant)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(ops=queue_ops)
def test_the_keyed_queue_pops_in_key_order_then_queueing_order(
    ops: list[tuple[str, int, int]]
) -> None:
    queue = KeyedRequestQueue(lambda r: (r.num_prompt_tokens,))
    model: list[tuple[int, int, Request]] = []  # (key, queueing number, request)
    outside: dict[int, Request] = {}
    counter = 0
    for op, i, length in ops:
        if op == "add" and i not in outside and all(r.req_id != str(i) for *_, r in model):
            r = _request(i, length)
            queue.add_request(r)
            model.append((length, counter, r))
            counter += 1
        elif op == "pop" and model:
            model.sort(key=lambda e: (e[0], e[1]))
            assert queue.peek_request() is model[0][2]
            _, _, r = model.pop(0)
            assert queue.pop_request() is r
            outside[int(r.req_id)] = r
        elif op == "prepend" and outside:
            r = outside.pop(sorted(outside)[i % len(outside)])
            queue.prepend_request(r)
            model.append((r.num_prompt_tokens, counter, r))
            counter += 1
        elif op == "remove" and model:
            _, _, r = model.pop(i % len(model))
            queue.remove_requests([r])
        assert len(queue) == len(model) and bool(queue) == bool(model)
        assert list(queue) == [r for *_, r in sorted(model, key=lambda e: (e[0], e[1]))]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(ops=queue_ops)
def test_the_vtc_queue_serves_the_least_served_backlogged_tenant_fifo(
    ops: list[tuple[str, int, int]]
) -> None:
    counters = TenantCounters(1.0, 2.0)
    queue = VirtualTokenCounterQueue(counters)
    model: dict[str, list[Request]] = {}
    made = 0
    for op, i, length in ops:
        if op == "add":
            made += 1
            tenant = TENANTS[i % 3]
            r = _request(made, length, tenant)
            queue.add_request(r)
            model.setdefault(tenant, []).append(r)
        elif op == "pop" and any(model.values()):
            backlogged = [t for t in queue.queues if model.get(t)]
            least = min(counters.counter(t) for t in backlogged)
            head = queue.peek_request()
            assert counters.counter(head.tenant) == least
            assert head is model[head.tenant][0]  # FIFO within a tenant
            assert queue.pop_request() is head
            model[head.tenant].pop(0)
            head.status = RequestStatus.RUNNING  # admitted: its prompt now counts
            head.append_output_tokens(1, length % 5)
        elif op == "remove" and any(model.values()):
            tenant = [t for t in model if model[t]][i % len([t for t in model if model[t]])]
            r = model[tenant].pop(i % len(model[tenant]))
            queue.remove_requests([r])
        assert len(queue) == sum(len(v) for v in model.values())
        assert bool(queue) == any(model.values())
