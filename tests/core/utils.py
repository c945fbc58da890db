"""Helpers for scheduler tests in vLLM's style: schedule → hand-made runner output → update.

They mirror vLLM's ``tests/v1/core/utils.py`` defaults (SCHEDULER_SPEC.md §3): max_num_seqs 16,
budget 8192, max_model_len = budget, block size 16, 10000 blocks, chunked prefill on, prefix
caching on, EOS 50256; requests of 10 tokens ``[i]*10``, max_tokens 16, ids "0", "1", ….
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from engine.core.block_pool import NULL_BLOCK_ID, BlockPool
from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.hashing import TokenBlockHasher
from engine.core.outputs import (
    AdmissionBlocker,
    BatchShape,
    CachedRequestData,
    ModelRunnerOutput,
    SchedulerOutput,
)
from engine.core.request import Request, RequestStatus, SamplingParams
from engine.core.scheduler import Scheduler

EOS_TOKEN_ID = 50256


def create_scheduler(
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    max_model_len: int | None = None,
    enable_prefix_caching: bool = True,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    num_blocks: int = 10000,
    block_size: int = 16,
    policy: str = "fcfs",
    scheduler_reserve_full_isl: bool = True,
    async_scheduling: bool = False,
    watermark: float = 0.0,
) -> Scheduler:
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len or max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=policy,  # type: ignore[arg-type]
            scheduler_reserve_full_isl=scheduler_reserve_full_isl,
            async_scheduling=async_scheduling,
        ),
        cache=CacheConfig(
            num_gpu_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            watermark=watermark,
        ),
    )
    return Scheduler(config)


def create_requests(
    num_requests: int,
    num_tokens: int = 10,
    *,
    max_tokens: int = 16,
    min_tokens: int = 0,
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
    same_prompt: bool = False,
    block_size: int = 16,
    prompt_token_ids: list[list[int]] | None = None,
    priorities: list[int] | None = None,
    arrival_times: list[float] | None = None,
    req_ids: list[str] | None = None,
    eos_token_id: int | None = EOS_TOKEN_ID,
) -> list[Request]:
    hasher = TokenBlockHasher(block_size)
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=ignore_eos,
    )
    requests = []
    for i in range(num_requests):
        if prompt_token_ids is not None:
            prompt = prompt_token_ids[i]
        else:
            prompt = [0] * num_tokens if same_prompt else [i] * num_tokens
        requests.append(
            Request(
                req_ids[i] if req_ids else str(i),
                sampling_params=params,
                prompt_token_ids=prompt,
                arrival_time=arrival_times[i] if arrival_times else float(i),
                priority=priorities[i] if priorities else 0,
                eos_token_id=eos_token_id,
                block_hasher=hasher,
            )
        )
    return requests


def sample_all(out: SchedulerOutput, token_id: int = 0) -> ModelRunnerOutput:
    """Every request that finished its prefill samples ``token_id``."""
    return ModelRunnerOutput(
        {r: [token_id] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids}
    )


def make_output(sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(dict(sampled))


def step(scheduler: Scheduler, token_id: int = 0) -> SchedulerOutput:
    """schedule() then update_from_output() with every sampling request emitting token_id."""
    out = scheduler.schedule()
    scheduler.update_from_output(out, sample_all(out, token_id))
    return out


# -- more helpers (vLLM's make_request / assert_scheduler_empty, and invariant checks) --------


def make_request(
    req_id: str,
    prompt_token_ids: list[int],
    *,
    block_size: int = 16,
    max_tokens: int = 16,
    min_tokens: int = 0,
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
    priority: int = 0,
    arrival_time: float = 0.0,
    eos_token_id: int | None = EOS_TOKEN_ID,
) -> Request:
    """One request with the given prompt, hashed in blocks of ``block_size`` (vLLM's helper)."""
    return Request(
        req_id,
        sampling_params=SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            stop_token_ids=tuple(stop_token_ids),
            ignore_eos=ignore_eos,
        ),
        prompt_token_ids=prompt_token_ids,
        arrival_time=arrival_time,
        priority=priority,
        eos_token_id=eos_token_id,
        block_hasher=TokenBlockHasher(block_size),
    )


def index_output(out: SchedulerOutput) -> ModelRunnerOutput:
    """vLLM's async-test runner output: the i-th scheduled request samples token ``i``.

    Requests still mid-prefill sample nothing.
    """
    return ModelRunnerOutput(
        {
            r: [i]
            for i, r in enumerate(out.num_scheduled_tokens)
            if r not in out.partial_prefill_req_ids
        }
    )


def make_scheduler_output(num_scheduled_tokens: dict[str, int]) -> SchedulerOutput:
    """A hand-made SchedulerOutput that only carries ``num_scheduled_tokens`` (as vLLM's tests
    build one to drive ``update_from_output`` for requests put into RUNNING by hand)."""
    return SchedulerOutput(
        step_id=0,
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens=dict(num_scheduled_tokens),
        total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
        partial_prefill_req_ids=set(),
        preempted_req_ids=set(),
        finished_req_ids=set(),
        batch_shape=BatchShape.empty(),
        admission_blocker=AdmissionBlocker.NONE,
    )


def assert_block_pool_consistent(
    pool: BlockPool, holders: Iterable[Sequence[int]] | None = None
) -> None:
    """The block pool's own invariants; given ``holders`` (every live block table, possibly
    none), also that each ref count equals the number of tables holding the block."""
    n = pool.num_gpu_blocks
    free = pool.free_queue.get_all_free_blocks()
    assert len(free) == len(set(free)) == pool.free_queue.num_free_blocks, "free queue corrupt"
    assert NULL_BLOCK_ID not in free and pool.ref_cnt[NULL_BLOCK_ID] == 0
    assert all(0 < b < n for b in free)
    zero_ref = {b for b in range(1, n) if pool.ref_cnt[b] == 0}
    assert set(free) == zero_ref, "a block is in the free queue iff its ref_cnt is 0"
    assert all(c >= 0 for c in pool.ref_cnt)
    num_held = sum(1 for b in range(1, n) if pool.ref_cnt[b] > 0)
    assert pool.get_num_free_blocks() + num_held == n - 1
    # The hash map and the per-block hashes describe the same (hash, block) pairs.
    pairs = set()
    for h, entry in pool.hash_to_block.items():
        ids = [entry] if isinstance(entry, int) else entry
        assert ids and len(ids) == len(set(ids))
        assert isinstance(entry, int) or len(entry) >= 2
        for b in ids:
            assert pool.block_hash[b] == h, f"map entry {h!r} -> {b} but block carries another"
            pairs.add((h, b))
    hashed = {(h, b) for b, h in enumerate(pool.block_hash) if h is not None}
    # every pair is in the map, but private ones (negative int hashes) not yet published
    assert pairs <= hashed
    for h, b in hashed - pairs:
        assert isinstance(h, int) and h < 0, f"block {b} carries {h!r}, missing from the map"
    assert {b for _, b in pairs} == {b for b in range(n) if pool.in_map[b]}, "in_map is stale"
    assert pool.block_hash[NULL_BLOCK_ID] is None, "the null block carries a hash"
    if holders is not None:
        held = Counter(b for table in holders for b in table)
        assert NULL_BLOCK_ID not in held
        for b in range(1, n):
            assert pool.ref_cnt[b] == held.get(b, 0), f"block {b}: ref_cnt != holders"


def assert_scheduler_consistent(scheduler: Scheduler) -> None:
    """Every invariant the scheduler and its KV cache must keep between calls."""
    kv = scheduler.kv_cache_manager
    bs = kv.block_size
    running, waiting = scheduler.running, list(scheduler.waiting)
    assert len(running) <= scheduler.max_num_seqs
    assert len({id(r) for r in running}) == len(running)
    assert len({id(r) for r in waiting}) == len(waiting)
    assert not {id(r) for r in running} & {id(r) for r in waiting}, "request in two queues"
    live = {id(r) for r in scheduler.requests.values()}
    assert {id(r) for r in running} | {id(r) for r in waiting} == live
    assert all(scheduler.requests[r.req_id] is r for r in running + waiting)
    for r in running:
        assert r.status == RequestStatus.RUNNING
        num_slots = min(r.num_computed_tokens, scheduler.max_model_len)
        assert len(r.block_ids) >= -(-num_slots // bs), f"{r.req_id} holds too few blocks"
        assert r.num_cached_blocks <= len(r.block_ids)
        if kv.enable_caching:
            for i in range(r.num_cached_blocks):
                assert kv.block_pool.block_hash[r.block_ids[i]] == r.block_hashes[i]
    for r in waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert not r.block_ids and r.num_computed_tokens == 0
    assert_block_pool_consistent(kv.block_pool, [r.block_ids for r in running])


def assert_scheduler_empty(scheduler: Scheduler) -> None:
    """No requests and no leaked blocks (vLLM's ``assert_scheduler_empty``).

    Cached hashes may remain: eviction is lazy.
    """
    assert not scheduler.requests
    assert not scheduler.running
    assert not scheduler.waiting
    assert not scheduler.finished_req_ids
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert all(c == 0 for c in pool.ref_cnt)
    assert_block_pool_consistent(pool, holders=[])


def run_steps(
    scheduler: Scheduler,
    arrivals: dict[int, list[Request]],
    *,
    token_id: int = 7,
    max_steps: int = 1000,
    check: bool = True,
) -> list[dict[str, object]]:
    """Drive a synchronous scheduler step by step, like the vLLM oracle's replay loop.

    ``arrivals[s]`` are added before step ``s`` schedules; every request that completes its
    prefill samples ``token_id``. Returns one record per step: scheduled tokens, new requests
    with their prefix hit, resumed and preempted ids, finish reasons, free blocks and running ids.
    With ``check`` the scheduler's invariants are asserted after every step.
    """
    records: list[dict[str, object]] = []
    last_arrival = max(arrivals, default=-1)
    for s in range(max_steps):
        for request in arrivals.get(s, []):
            scheduler.add_request(request)
        if s > last_arrival and not scheduler.has_requests():
            break
        out = scheduler.schedule()
        outputs = scheduler.update_from_output(out, sample_all(out, token_id))
        if check:
            assert out.total_num_scheduled_tokens <= scheduler.token_budget
            assert_scheduler_consistent(scheduler)
        records.append(
            {
                "scheduled": dict(out.num_scheduled_tokens),
                "new": {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs},
                "resumed": sorted(out.scheduled_cached_reqs.resumed_req_ids),
                "preempted": sorted(out.preempted_req_ids),
                "finished": {o.req_id: str(o.finish_reason) for o in outputs if o.finished},
                "free_blocks": scheduler.kv_cache_manager.get_num_free_blocks(),
                "running": [r.req_id for r in scheduler.running],
            }
        )
    return records
