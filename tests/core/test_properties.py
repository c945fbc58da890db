"""Hypothesis properties of the block pool, the KV cache manager and the scheduler.

Three stateful machines drive random operation sequences and check every invariant after each
rule (see ``assert_block_pool_consistent`` / ``assert_scheduler_consistent`` in utils):

* ``BlockPoolMachine`` — allocate / cache / prefix-hit (touch) / free / reset against a plain
  list model of vLLM's free-queue order (unhashed frees prepended, hashed ones appended);
* ``KVCacheManagerMachine`` — admit (lookup + allocate, optionally the full-sequence gate),
  append tokens, free; prompts share a few prefixes so hits happen; a failed allocation must
  leave the pool untouched;
* ``SchedulerMachine`` (sync and async) — random arrivals from shared prefixes, tight block
  counts so admission fails and preemption happens, random aborts and cache resets, both
  policies, driven through ``EngineCore``; ``teardown`` aborts everything and requires every
  block back in the free queue with ref count 0 (vLLM's test_memory_leak).

Plus a run-to-completion property: any workload, run until idle, leaves nothing behind.
Everything is derandomized and sized to run in a few seconds.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import hypothesis.strategies as st
from hypothesis import Phase, event, given, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from engine.core.block_pool import BlockPool
from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.hashing import TokenBlockHasher
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, RequestStatus, SamplingParams
from engine.core.scheduler import Scheduler
from tests.core.utils import (
    assert_block_pool_consistent,
    assert_scheduler_consistent,
    assert_scheduler_empty,
)

# No "explain" phase: it makes a failing run take minutes.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]
STATEFUL = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    phases=PHASES,
)

# -- the block pool against a list model of the free queue ---------------------------------------


class BlockPoolMachine(RuleBasedStateMachine):
    """Block pool operations checked against an exact model of the free-queue order."""

    NUM_BLOCKS = 7

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(self.NUM_BLOCKS, enable_caching=True)
        self.free_model = list(range(1, self.NUM_BLOCKS))
        self.hash_model: dict[int, Any] = {}  # block -> hash
        self.hash_order: dict[Any, list[int]] = {}  # hash -> blocks, insertion order
        self.tables: list[list[int]] = []  # live block tables
        self.table_hashes: list[list[Any]] = []  # hash each table position would carry
        self.table_cached: list[int] = []  # leading positions registered

    def _held(self) -> Counter[int]:
        return Counter(b for t in self.tables for b in t)

    @rule(
        n=st.integers(0, 4),
        keys=st.lists(st.integers(0, 3), min_size=4, max_size=4),
        num_cached=st.integers(0, 4),
    )
    def allocate(self, n: int, keys: list[int], num_cached: int) -> None:
        """Pop ``n`` blocks; register the first ``num_cached`` of them under small-alphabet keys
        (so different blocks often cache the same hash)."""
        if n > self.pool.get_num_free_blocks():
            return
        blocks = self.pool.get_new_blocks(n)
        assert blocks == self.free_model[:n]
        del self.free_model[:n]
        for b in blocks:
            h = self.hash_model.pop(b, None)  # lazily evicted now
            if h is not None:
                event("eviction")
                self.hash_order[h].remove(b)
                if not self.hash_order[h]:
                    del self.hash_order[h]
        self.tables.append(blocks)
        self.table_hashes.append([("h", k) for k in keys[:n]])
        self.table_cached.append(0)
        self._cache(len(self.tables) - 1, min(num_cached, n))

    def _cache(self, i: int, upto: int) -> None:
        table, hashes = self.tables[i], self.table_hashes[i]
        self.pool.cache_full_blocks(table, hashes, self.table_cached[i], upto)
        for pos in range(self.table_cached[i], upto):
            self.hash_model[table[pos]] = hashes[pos]
            self.hash_order.setdefault(hashes[pos], []).append(table[pos])
        self.table_cached[i] = max(upto, self.table_cached[i])

    @rule(i=st.integers(0, 15), more=st.integers(0, 4))
    def cache(self, i: int, more: int) -> None:
        """Register ``more`` further blocks of a live table."""
        if self.tables:
            i %= len(self.tables)
            self._cache(i, min(self.table_cached[i] + more, len(self.tables[i])))

    @rule(k=st.integers(0, 15))
    def prefix_hit(self, k: int) -> None:
        """Look a cached hash up and touch its block (a new one-block table)."""
        if not self.hash_order:
            return
        h = sorted(self.hash_order)[k % len(self.hash_order)]
        b = self.pool.get_cached_block(h)
        # The earliest-inserted block of that hash still cached is returned.
        assert b == self.hash_order[h][0] and self.hash_model[b] == h
        if self.pool.ref_cnt[b] == 0:
            event("hit on a free cached block")
            self.free_model.remove(b)
        self.pool.touch([b])
        self.tables.append([b])
        self.table_hashes.append([h])
        self.table_cached.append(1)

    @rule(i=st.integers(0, 15))
    def free(self, i: int) -> None:
        if not self.tables:
            return
        i %= len(self.tables)
        table = self.tables.pop(i)
        self.table_hashes.pop(i)
        self.table_cached.pop(i)
        self.pool.free_blocks(reversed(table))
        held = self._held()
        first: list[int] = []
        last: list[int] = []
        for b in reversed(table):
            if held[b] == 0:
                (last if b in self.hash_model else first).append(b)
        self.free_model = first + self.free_model + last

    @rule()
    def reset_prefix_cache(self) -> None:
        ok = self.pool.reset_prefix_cache()
        assert ok == (not self.tables or not any(self.tables))
        if ok:
            self.hash_model.clear()
            self.hash_order.clear()

    @invariant()
    def consistent(self) -> None:
        assert self.pool.free_queue.get_all_free_blocks() == self.free_model
        assert {b: h for b, h in enumerate(self.pool.block_hash) if h is not None} == (
            self.hash_model
        )
        assert {
            h: [e] if isinstance(e, int) else list(e) for h, e in self.pool.hash_to_block.items()
        } == self.hash_order
        assert_block_pool_consistent(self.pool, self.tables)


TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = settings(STATEFUL, max_examples=100)


# -- the KV cache manager ------------------------------------------------------------------------

BS = 4
# Prompts start with one of a few shared prefixes (so prefix hits happen), then diverge.
PREFIXES = [[1] * 12, [2] * 8 + [3] * 4, [1] * 8 + [4] * 8]


def _prompt(prefix: int, prefix_len: int, suffix: list[int]) -> list[int]:
    return PREFIXES[prefix][:prefix_len] + suffix


class KVCacheManagerMachine(RuleBasedStateMachine):
    """Admissions with prefix hits, appends and frees on a tight KV cache."""

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(
            num_gpu_blocks=10, block_size=BS, max_model_len=64, enable_caching=True
        )
        self.live: list[Request] = []
        self.hasher = TokenBlockHasher(BS)
        self.counter = 0

    def _snapshot(self) -> tuple[Any, ...]:
        pool = self.manager.block_pool
        return (
            list(pool.ref_cnt),
            list(pool.block_hash),
            pool.free_queue.get_all_free_blocks(),
            {h: (e if isinstance(e, int) else list(e)) for h, e in pool.hash_to_block.items()},
        )

    @rule(
        prefix=st.integers(0, len(PREFIXES) - 1),
        prefix_len=st.integers(0, 16),
        suffix=st.lists(st.integers(5, 7), max_size=10),
        must_fit=st.booleans(),
    )
    def admit(self, prefix: int, prefix_len: int, suffix: list[int], must_fit: bool) -> None:
        prompt = _prompt(prefix, prefix_len, suffix)
        if not prompt:
            return
        self.counter += 1
        request = Request(
            str(self.counter), sampling_params=SamplingParams(max_tokens=64),
            prompt_token_ids=prompt, block_hasher=self.hasher,
        )
        hits, num_hit = self.manager.get_computed_blocks(request)
        assert num_hit == len(hits) * BS and num_hit <= len(prompt) - 1
        pool = self.manager.block_pool
        for i, b in enumerate(hits):
            assert pool.block_hash[b] == request.block_hashes[i]
        before = self._snapshot()
        new = self.manager.allocate_slots(
            request, len(prompt) - num_hit, num_hit, hits, full_sequence_must_fit=must_fit
        )
        if hits:
            event("prefix hit")
        if new is None:
            event("admission refused")
            assert self._snapshot() == before, "a failed allocation must change nothing"
            assert not request.block_ids
            return
        assert request.block_ids == [*hits, *new]
        assert len(request.block_ids) == -(-len(prompt) // BS)
        request.num_computed_tokens = len(prompt)
        request.status = RequestStatus.RUNNING
        self.live.append(request)

    @rule(i=st.integers(0, 15), tokens=st.lists(st.integers(5, 7), min_size=1, max_size=6))
    def append(self, i: int, tokens: list[int]) -> None:
        if not self.live:
            return
        request = self.live[i % len(self.live)]
        if request.num_tokens + len(tokens) > 64:
            return
        before = self._snapshot()
        for t in tokens:
            request.append_output_token_id(t)
        held = len(request.block_ids)
        # Tokens of earlier failed appends are still uncomputed: allocate for all of them.
        new = self.manager.allocate_running_slots(
            request, request.num_tokens - request.num_computed_tokens
        )
        if new is None:
            event("append refused")
            assert self._snapshot() == before
            return
        assert len(request.block_ids) == held + len(new)
        assert len(request.block_ids) == -(-request.num_tokens // BS)
        request.num_computed_tokens = request.num_tokens

    @rule(i=st.integers(0, 15))
    def free(self, i: int) -> None:
        if not self.live:
            return
        request = self.live.pop(i % len(self.live))
        self.manager.free(request)
        assert not request.block_ids

    @invariant()
    def consistent(self) -> None:
        pool = self.manager.block_pool
        assert_block_pool_consistent(pool, [r.block_ids for r in self.live])
        for r in self.live:
            assert r.num_cached_blocks == min(r.num_computed_tokens // BS, len(r.block_hashes))
            for i in range(r.num_cached_blocks):
                assert pool.block_hash[r.block_ids[i]] == r.block_hashes[i]

    def teardown(self) -> None:
        for r in self.live:
            self.manager.free(r)
        pool = self.manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        assert all(c == 0 for c in pool.ref_cnt)


TestKVCacheManager = KVCacheManagerMachine.TestCase
TestKVCacheManager.settings = STATEFUL


# -- the scheduler through EngineCore -----------------------------------------------------------

EOS = 0
MAX_MODEL_LEN = 48  # 12 blocks of 4: a lone request always fits in the cache


def _engine_config(draw: Any, async_scheduling: bool) -> EngineConfig:
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 6))
    budget = draw(st.integers(MAX_MODEL_LEN if not chunked else max(max_num_seqs, 6), 64))
    return EngineConfig(
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=chunked,
            long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 16])),
            policy=draw(st.sampled_from(["fcfs", "priority"])),
            scheduler_reserve_full_isl=draw(st.booleans()),
            async_scheduling=async_scheduling,
        ),
        cache=CacheConfig(
            num_gpu_blocks=draw(st.integers(MAX_MODEL_LEN // BS + 1, 18)),
            block_size=BS,
            enable_prefix_caching=draw(st.sampled_from([True, True, False])),
            watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
        ),
    )


class _EngineDriver:
    """Steps an EngineCore like the golden replay; every sampling request draws a token."""

    def __init__(self, config: EngineConfig) -> None:
        self.core = EngineCore(config)
        self.pending: dict[int, ModelRunnerOutput] = {}
        self.now = 0.0
        self.counter = 0
        self.hasher = TokenBlockHasher(BS)
        self.all_requests: dict[str, Request] = {}

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    def add(self, prompt: list[int], max_tokens: int, priority: int, ignore_eos: bool) -> None:
        self.counter += 1
        request = Request(
            f"r{self.counter}",
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
            prompt_token_ids=prompt,
            arrival_time=self.now,
            priority=priority,
            eos_token_id=EOS,
            block_hasher=self.hasher,
        )
        self.all_requests[request.req_id] = request  # every request, checked at the end
        self.core.add_request(request, self.now)

    def step(self, rng: random.Random) -> SchedulerOutput | None:
        self.now += 1.0
        scheduler = self.scheduler
        out = self.core.begin_step(self.now)
        if out is not None:
            self.pending[out.step_id] = ModelRunnerOutput(
                {
                    r: [rng.randrange(10)]
                    for r in out.num_scheduled_tokens
                    if r not in out.partial_prefill_req_ids
                }
            )
            check_schedule(scheduler, out)
            _record_coverage(out)
        if self.core.must_finish_step():
            self.apply_oldest()
        return out

    def apply_oldest(self) -> None:
        oldest = self.core.oldest_in_flight()
        outputs = self.core.finish_step(oldest, self.pending.pop(oldest.step_id), self.now)
        for o in outputs:
            assert o.new_token_ids or o.finished
            assert o.req_id not in self.scheduler.requests or not o.finished

    def drain(self, max_steps: int = 2000) -> None:
        rng = random.Random(0)
        for _ in range(max_steps):
            if not self.core.has_work():
                return
            self.step(rng)
        raise AssertionError("the engine did not become idle")


def _record_coverage(out: SchedulerOutput) -> None:
    """Label what a step exercised (shown by ``--hypothesis-show-statistics``)."""
    if out.preempted_req_ids:
        event("preemption")
    if out.scheduled_cached_reqs.resumed_req_ids:
        event("resumption")
    if any(n.num_computed_tokens for n in out.scheduled_new_reqs):
        event("prefix hit")
    if out.partial_prefill_req_ids:
        event("chunked prefill")
    event(f"admission blocker: {out.admission_blocker.value or 'none'}")


def check_schedule(scheduler: Any, out: SchedulerOutput) -> None:
    """What every SchedulerOutput must satisfy."""
    scheduled = out.num_scheduled_tokens
    assert all(n > 0 for n in scheduled.values())
    assert sum(scheduled.values()) == out.total_num_scheduled_tokens
    assert out.total_num_scheduled_tokens <= scheduler.token_budget
    assert len(scheduler.running) <= scheduler.max_num_seqs
    running_ids = {r.req_id for r in scheduler.running}
    assert set(scheduled) <= running_ids, "only running requests are scheduled"
    assert out.partial_prefill_req_ids <= set(scheduled)
    new_ids = [n.req_id for n in out.scheduled_new_reqs]
    cached = out.scheduled_cached_reqs
    # A request preempted in this step is not scheduled in it, except one preempted by
    # reset_prefix_cache(reset_running_requests=True) since the last step, which may resume.
    assert out.preempted_req_ids & set(scheduled) <= cached.resumed_req_ids
    assert sorted(new_ids + cached.req_ids) == sorted(scheduled)
    assert cached.resumed_req_ids <= set(cached.req_ids)
    for new in out.scheduled_new_reqs:
        assert new.num_computed_tokens % BS == 0
        assert scheduler.requests[new.req_id].num_computed_tokens == (
            new.num_computed_tokens + scheduled[new.req_id]
        )
    assert out.batch_shape.num_tokens == out.total_num_scheduled_tokens


# Mostly whole shared prefixes (prefix hits), sometimes none or a cut one.
PREFIX_LENGTHS = st.sampled_from([0, 6, 12, 16, 16])
request_specs = st.lists(
    st.tuples(
        st.integers(0, len(PREFIXES) - 1),  # prefix
        PREFIX_LENGTHS,  # prefix length
        st.lists(st.integers(5, 9), max_size=24),  # suffix
        st.integers(1, 12),  # max_tokens
        st.integers(0, 2),  # priority
        st.integers(0, 5),  # arrival step
    ),
    min_size=2,
    max_size=12,
)


class SchedulerMachine(RuleBasedStateMachine):
    ASYNC = False

    def __init__(self) -> None:
        super().__init__()
        self.driver: _EngineDriver | None = None

    @initialize(data=st.data(), initial=request_specs)
    def configure(self, data: st.DataObject, initial: list[tuple[Any, ...]]) -> None:
        """A random configuration, with a first batch of requests so every example has work."""
        self.driver = _EngineDriver(_engine_config(data.draw, self.ASYNC))
        for prefix, prefix_len, suffix, max_tokens, priority, _ in initial:
            prompt = _prompt(prefix, prefix_len, suffix)[: MAX_MODEL_LEN - 1] or [5]
            self.driver.add(prompt, max_tokens, priority, ignore_eos=False)

    @rule(
        prefix=st.integers(0, len(PREFIXES) - 1),
        prefix_len=PREFIX_LENGTHS,
        suffix=st.lists(st.integers(5, 9), max_size=24),
        max_tokens=st.integers(1, 12),
        priority=st.integers(0, 2),
        ignore_eos=st.booleans(),
    )
    def add_request(
        self, prefix: int, prefix_len: int, suffix: list[int], max_tokens: int, priority: int,
        ignore_eos: bool,
    ) -> None:
        assert self.driver is not None
        prompt = _prompt(prefix, prefix_len, suffix)[: MAX_MODEL_LEN - 1]
        if prompt:
            self.driver.add(prompt, max_tokens, priority, ignore_eos)

    @rule(seed=st.integers(0, 2**16), num_steps=st.integers(1, 4))
    def step(self, seed: int, num_steps: int) -> None:
        assert self.driver is not None
        rng = random.Random(seed)
        for _ in range(num_steps):
            self.driver.step(rng)
            assert_scheduler_consistent(self.driver.scheduler)

    @rule(seed=st.integers(0, 2**16), num_steps=st.integers(1, 4))
    def step_again(self, seed: int, num_steps: int) -> None:
        """Stepping is the main event: a second rule doubles its share."""
        self.step(seed, num_steps)

    @rule(i=st.integers(0, 31))
    def abort(self, i: int) -> None:
        assert self.driver is not None
        live = sorted(self.driver.scheduler.requests)
        if not live:
            return
        req_id = live[i % len(live)]
        if self.driver.scheduler.requests[req_id].num_in_flight_tokens:
            event("abort with output in flight")
        (out,) = self.driver.core.abort_requests([req_id], self.driver.now)
        assert str(out.finish_reason) == "abort"
        assert req_id not in self.driver.scheduler.requests

    @rule(reset_running=st.booleans())
    def reset_prefix_cache(self, reset_running: bool) -> None:
        assert self.driver is not None
        scheduler = self.driver.scheduler
        held = scheduler.kv_cache_manager.get_num_free_blocks() < (
            scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
        )
        ok = scheduler.reset_prefix_cache(reset_running_requests=reset_running)
        assert ok == (reset_running or not held)
        if ok:
            assert not scheduler.kv_cache_manager.block_pool.hash_to_block
            assert not scheduler.running

    @invariant()
    def consistent(self) -> None:
        if self.driver is not None:
            assert_scheduler_consistent(self.driver.scheduler)

    def teardown(self) -> None:
        """Abort everything, apply what is in flight: every block is free again."""
        driver = self.driver
        if driver is None:
            return
        driver.core.abort_requests(sorted(driver.scheduler.requests), driver.now)
        while driver.core.num_in_flight:
            driver.apply_oldest()
        driver.core.begin_step(driver.now + 1)  # ships the finished ids
        assert_scheduler_empty(driver.scheduler)
        for request in driver.all_requests.values():
            assert request.is_finished()
            assert not request.block_ids
            assert request.num_output_tokens <= request.max_tokens


class AsyncSchedulerMachine(SchedulerMachine):
    ASYNC = True


SCHEDULER_STATEFUL = settings(STATEFUL, max_examples=60)
TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = SCHEDULER_STATEFUL
TestAsyncScheduler = AsyncSchedulerMachine.TestCase
TestAsyncScheduler.settings = SCHEDULER_STATEFUL


# -- run to completion: nothing leaks, every request ends properly -------------------------------


@settings(max_examples=100, deadline=None, derandomize=True, database=None, phases=PHASES)
@given(data=st.data(), specs=request_specs, async_scheduling=st.booleans(), seed=st.integers(0, 99))
def test_every_workload_runs_to_completion_without_leaks(
    data: st.DataObject, specs: list[tuple[Any, ...]], async_scheduling: bool, seed: int
) -> None:
    driver = _EngineDriver(_engine_config(data.draw, async_scheduling))
    rng = random.Random(seed)
    by_step: dict[int, list[tuple[Any, ...]]] = {}
    for spec in specs:
        by_step.setdefault(spec[5], []).append(spec)
    for step in range(6):
        for prefix, prefix_len, suffix, max_tokens, priority, _ in by_step.get(step, []):
            prompt = _prompt(prefix, prefix_len, suffix)[: MAX_MODEL_LEN - 1] or [5]
            driver.add(prompt, max_tokens, priority, ignore_eos=False)
        driver.step(rng)
        assert_scheduler_consistent(driver.scheduler)
    driver.drain()
    assert_scheduler_empty(driver.scheduler)
    for request in driver.all_requests.values():
        reason = request.get_finished_reason()
        assert reason is not None and str(reason) in ("stop", "length")
        if str(reason) == "stop":
            assert request.output_token_ids[-1] == EOS
        else:
            assert (
                request.num_output_tokens == request.max_tokens
                or request.num_tokens >= MAX_MODEL_LEN
            )
        assert EOS not in request.output_token_ids[:-1]
