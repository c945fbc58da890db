"""Private block hashes enter the hash map only when their request is preempted — and nothing
observable changes.

``PrecomputedBlockHasher`` keys the blocks unique to a request with negative ints when its
unique id is an int (private: published lazily, see ``engine/core/block_pool.py``) and with
tuples otherwise (mapped at once, like every other hash). The same workloads, run once each
way through tight KV caches with preemptions and shared prefixes, must schedule identically:
the same tokens, block ids, free-queue order, prefix hits and records.
"""

from __future__ import annotations

import random

import pytest

from engine.core.block_pool import PRIVATE_HASH
from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.hashing import PrecomputedBlockHasher
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, SamplingParams
from tests.core.utils import assert_block_pool_consistent

BS = 4


def _runner_output(out: SchedulerOutput) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        {r: [0] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids}
    )


def _workload(seed: int) -> list[tuple[int, int, int, int]]:
    """(arrival step, prompt length, shared prefix blocks, max_tokens) per request."""
    rng = random.Random(seed)
    return [
        (rng.randrange(0, 40), rng.randint(1, 40), rng.choice([0, 0, 1, 3]), rng.randint(1, 30))
        for _ in range(rng.randint(4, 16))
    ]


def _run(seed: int, int_ids: bool, async_scheduling: bool) -> tuple[list[object], EngineCore]:
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=6, max_model_len=128,
                                  async_scheduling=async_scheduling),
        cache=CacheConfig(num_gpu_blocks=random.Random(seed).choice([16, 24, 40]),
                          block_size=BS),
    )
    core = EngineCore(config)
    pending = sorted(enumerate(_workload(seed)), key=lambda x: x[1][0])
    trace: list[object] = []
    pool = core.scheduler.kv_cache_manager.block_pool
    for step in range(400):
        while pending and pending[0][1][0] <= step:
            i, (_, prompt_len, shared, max_tokens) = pending.pop(0)
            keys = [("shared", j) for j in range(min(shared, prompt_len // BS))]
            hasher = PrecomputedBlockHasher(BS, keys, unique_id=i if int_ids else f"r{i}")
            core.add_request(Request(str(i), sampling_params=SamplingParams(max_tokens=max_tokens),
                                     num_prompt_tokens=prompt_len, block_hasher=hasher),
                             float(step))
        if not pending and not core.has_work():
            break
        out = core.begin_step(float(step))
        if out is not None:
            trace.append((
                dict(out.num_scheduled_tokens),
                [(n.req_id, n.block_ids, n.num_computed_tokens) for n in out.scheduled_new_reqs],
                out.scheduled_cached_reqs.new_block_ids,
                sorted(out.preempted_req_ids),
            ))
        if core.must_finish_step():
            oldest = core.oldest_in_flight()
            core.finish_step(oldest, _runner_output(oldest), float(step))
        trace.append((
            pool.free_queue.get_all_free_blocks(),
            list(pool.ref_cnt),
            [h is None for h in pool.block_hash],
        ))
        assert_block_pool_consistent(pool)
    return trace, core


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("seed", range(25))
def test_private_hashes_change_no_decision(seed: int, async_scheduling: bool) -> None:
    lazy, lazy_core = _run(seed, True, async_scheduling)
    eager, eager_core = _run(seed, False, async_scheduling)
    assert lazy == eager
    kv_lazy = lazy_core.scheduler.kv_cache_manager.prefix_cache_stats
    kv_eager = eager_core.scheduler.kv_cache_manager.prefix_cache_stats
    assert kv_lazy == kv_eager


def test_the_workloads_preempt_and_hit_after_preemption() -> None:
    """The comparisons above do exercise publication: preempted requests come back and hit
    their own (published) blocks."""
    preemptions = resumed_hits = 0
    for seed in range(25):
        _, core = _run(seed, True, False)
        preemptions += core.scheduler.num_preemptions
        resumed_hits += core.scheduler.kv_cache_manager.prefix_cache_stats.preempted_hits
    assert preemptions >= 50 and resumed_hits >= 100


def test_a_preempted_request_publishes_its_generated_blocks() -> None:
    manager = KVCacheManager(num_gpu_blocks=20, block_size=BS, max_model_len=64,
                             enable_caching=True)
    pool = manager.block_pool
    request = Request("r", sampling_params=SamplingParams(max_tokens=8), num_prompt_tokens=13,
                      block_hasher=PrecomputedBlockHasher(BS, [("shared", 0)], unique_id=7))
    assert request.block_hashes[0] == ("shared", 0) and request.block_hashes[1] < 0
    blocks = manager.allocate_slots(request, 13)
    assert blocks is not None and len(blocks) == 4
    # the shared block is mapped at once; the private ones only carry the private marker (their
    # keys stay with the request)
    assert pool.hash_to_block == {("shared", 0): blocks[0]}
    assert [pool.block_hash[b] for b in blocks[:3]] == [("shared", 0), PRIVATE_HASH, PRIVATE_HASH]
    assert [pool.in_map[b] for b in blocks] == [True, False, False, False]
    assert manager.get_computed_blocks(request) == ([blocks[0]], BS)
    manager.free_preempted(request)
    assert {pool.hash_to_block[h] for h in request.block_hashes} == set(blocks[:3])
    assert [pool.block_hash[b] for b in blocks[:3]] == request.block_hashes  # published
    assert manager.get_computed_blocks(request) == (blocks[:3], 3 * BS)
    # a finished request's private blocks stay unpublished, and are evicted without the map
    other = Request("o", sampling_params=SamplingParams(max_tokens=8), num_prompt_tokens=8,
                    block_hasher=PrecomputedBlockHasher(BS, [], unique_id=8))
    other_blocks = manager.allocate_slots(other, 8)
    assert other_blocks is not None
    manager.free(other)
    assert not any(pool.in_map[b] for b in other_blocks)
    assert all(pool.block_hash[b] is not None for b in other_blocks)
    assert_block_pool_consistent(pool)
