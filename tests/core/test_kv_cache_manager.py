"""KV cache manager, block pool, free queue and block hashing (SCHEDULER_SPEC §3 #51–70).

vLLM's tests/v1/core/test_prefix_caching.py and test_kv_cache_utils.py at unit level: B=16 and
11 blocks (10 usable) unless stated. Block ids and free-queue orders are 0.33.0's: freed blocks
without a hash are *prepended* (reused first), hashed ones appended (LRU), each request's blocks
freed tail first.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

from engine.core.block_pool import NULL_BLOCK_ID, BlockPool, FreeBlockQueue
from engine.core.hashing import (
    NONE_HASH,
    PrecomputedBlockHasher,
    TokenBlockHasher,
    hash_block_tokens,
)
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request, RequestStatus, SamplingParams
from tests.core.utils import assert_block_pool_consistent, make_request

ROOT = Path(__file__).resolve().parents[2]


def _manager(num_blocks: int = 11, block_size: int = 16, enable_caching: bool = True,
             watermark_blocks: int = 0) -> KVCacheManager:
    return KVCacheManager(
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        max_model_len=8192,
        enable_caching=enable_caching,
        watermark_blocks=watermark_blocks,
    )


def _allocate(
    manager: KVCacheManager, request: Request, num_new_tokens: int | None = None
) -> list[int] | None:
    """vLLM's test pattern: look the cache up, then allocate the rest of the prompt."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - num_hit_tokens
    return manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits)


def _free_order(manager: KVCacheManager) -> list[int]:
    return manager.block_pool.free_queue.get_all_free_blocks()


def _chain(token_ids: list[int], block_size: int = 16) -> list[bytes]:
    hashes, parent = [], NONE_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


COMMON = [i for i in range(3) for _ in range(16)]  # 3 full blocks: 0×16, 1×16, 2×16


# -- prefix caching (test_prefix_caching.py) -----------------------------------------------------


def test_prefill() -> None:
    """#51"""
    manager = _manager()
    pool = manager.block_pool
    all_token_ids = COMMON + [3] * 7
    req0 = make_request("0", all_token_ids)
    assert len(req0.block_hashes) == 3
    hits, num_hit_tokens = manager.get_computed_blocks(req0)
    assert not hits and num_hit_tokens == 0
    assert manager.allocate_slots(req0, 55, 0, hits) == [1, 2, 3, 4]
    assert req0.block_ids == [1, 2, 3, 4]
    # Full blocks are hashed (chained from NONE_HASH) and referenced once; the partial one is not.
    for block_id, expected in zip((1, 2, 3), _chain(all_token_ids), strict=True):
        assert pool.block_hash[block_id] == expected
        assert pool.ref_cnt[block_id] == 1
    assert pool.block_hash[4] is None and pool.ref_cnt[4] == 1

    # A hit on the common prefix while its blocks are still in use.
    req1 = make_request("1", COMMON + [3] * 5)
    assert len(req1.block_hashes) == 3
    hits, num_hit_tokens = manager.get_computed_blocks(req1)
    assert list(hits) == [1, 2, 3] and num_hit_tokens == 48
    assert manager.allocate_slots(req1, 53 - 48, 48, hits) == [5]
    assert req1.block_ids == [1, 2, 3, 5]
    assert [pool.ref_cnt[b] for b in (1, 2, 3)] == [2, 2, 2]
    assert manager.get_num_free_blocks() == 5

    manager.free(req0)
    manager.free(req1)
    assert manager.get_num_free_blocks() == 10
    # Unhashed tails are prepended (reused first), hashed blocks appended deepest first.
    assert _free_order(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # A hit on the common prefix after its blocks were freed (they are still cached).
    req2 = make_request("2", COMMON + [3] * 6)
    hits, num_hit_tokens = manager.get_computed_blocks(req2)
    assert list(hits) == [1, 2, 3] and num_hit_tokens == 48
    assert manager.allocate_slots(req2, 54 - 48, 48, hits) == [5]
    assert manager.get_num_free_blocks() == 6
    assert all(pool.ref_cnt[b] == 0 for b in _free_order(manager))
    manager.free(req2)

    # A miss evicts in free-queue order, and the queue is drained.
    req3 = make_request("3", [99] * (16 * 10))
    hits, num_hit_tokens = manager.get_computed_blocks(req3)
    assert not hits and num_hit_tokens == 0
    assert manager.allocate_slots(req3, 16 * 10, 0, hits) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert manager.get_num_free_blocks() == 0
    assert _free_order(manager) == []
    assert_block_pool_consistent(pool, [req3.block_ids])


def test_decode() -> None:
    """#53"""
    manager = _manager()
    pool = manager.block_pool
    req0 = make_request("0", COMMON + [3] * 7)
    assert _allocate(manager, req0) == [1, 2, 3, 4]

    # 4 more tokens fit the partial block: nothing allocated, still unhashed.
    req0.num_computed_tokens = 55
    for _ in range(4):
        req0.append_output_token_id(8)
    assert manager.allocate_slots(req0, 4) == []
    assert pool.block_hash[req0.block_ids[-1]] is None

    # 9 tokens fill that block, 10 more go to one new block.
    req0.num_computed_tokens = 59
    for _ in range(9 + 10):
        req0.append_output_token_id(7)
    new_blocks = manager.allocate_slots(req0, 19)
    assert new_blocks is not None and len(new_blocks) == 1
    assert pool.block_hash[req0.block_ids[-2]] is not None
    assert pool.block_hash[req0.block_ids[-1]] is None
    assert req0.num_cached_blocks == 4


def test_evict() -> None:
    """#54"""
    manager = _manager()
    last_token_id = 5 * 16 + 7
    req0 = make_request("0", list(range(last_token_id)))
    blocks = _allocate(manager, req0)
    assert blocks is not None and len(blocks) == 6  # 5 full + 1 partial
    req1 = make_request("1", list(range(last_token_id, last_token_id + 3 * 16)))
    blocks = _allocate(manager, req1)
    assert blocks is not None and len(blocks) == 3
    assert manager.get_num_free_blocks() == 1

    manager.free(req0)
    assert _free_order(manager) == [6, 10, 5, 4, 3, 2, 1]
    manager.free(req1)
    assert manager.get_num_free_blocks() == 10
    assert _free_order(manager) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]

    # The first 35 tokens of req0: 2 cached blocks, and a new one from the head.
    req2 = make_request("2", list(range(2 * 16 + 3)))
    hits, num_hit_tokens = manager.get_computed_blocks(req2)
    assert list(hits) == [1, 2] and num_hit_tokens == 32
    assert manager.allocate_slots(req2, 3, num_hit_tokens, hits) == [6]
    assert manager.get_num_free_blocks() == 7
    assert _free_order(manager) == [10, 5, 4, 3, 9, 8, 7]


def test_hash_block_correct_reuse() -> None:
    """#55: 1 usable block. A freed cached block reused for a partial block loses its hash."""
    manager = _manager(num_blocks=2)
    req = make_request("0", list(range(16)))
    assert _allocate(manager, req) == [1]
    assert manager.block_pool.block_hash[1] is not None
    manager.free(req)
    req = make_request("1", list(range(15)))
    assert _allocate(manager, req) == [1]
    assert manager.block_pool.block_hash[1] is None
    assert not manager.block_pool.hash_to_block


def test_computed_blocks_not_evicted() -> None:
    """#56: 2 usable blocks. The hit block is touched; the other cached block is evicted."""
    manager = _manager(num_blocks=3)
    req0 = make_request("0", list(range(16)))
    assert _allocate(manager, req0) == [1]
    req1 = make_request("1", list(range(16, 32)))
    assert _allocate(manager, req1) == [2]
    manager.free(req0)
    manager.free(req1)
    assert _free_order(manager) == [1, 2]

    # Tokens 0..31: block 1 hits; block 2 caches 16..31 under a different parent, so no hit.
    req2 = make_request("2", list(range(32)))
    hits, num_hit_tokens = manager.get_computed_blocks(req2)
    assert list(hits) == [1] and num_hit_tokens == 16
    assert manager.allocate_slots(req2, 16, num_hit_tokens, hits) == [2]
    assert req2.block_ids == [1, 2]


def test_basic_prefix_caching_disabled() -> None:
    """#57: B=4, 5 blocks, caching off: no hits, and no blocks left → None."""
    manager = _manager(num_blocks=5, block_size=4, enable_caching=False)
    req1 = make_request("1", list(range(10)), block_size=4)
    assert manager.get_computed_blocks(req1) == ((), 0)
    blocks = _allocate(manager, req1)
    assert blocks is not None and len(blocks) == 3
    manager.free(req1)

    req2 = make_request("2", list(range(16)), block_size=4)
    hits, num_hit_tokens = manager.get_computed_blocks(req2)
    assert not hits and num_hit_tokens == 0
    blocks = _allocate(manager, req2)
    assert blocks is not None and len(blocks) == 4
    assert not manager.block_pool.hash_to_block

    req3 = make_request("3", list(range(4)), block_size=4)
    assert _allocate(manager, req3) is None
    assert not req3.block_ids


def test_cache_blocks() -> None:
    """#58: caching 2 blocks, then the 3rd, grows the hash map to 2 then 3."""
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True)
    request = make_request("0", list(range(3 * 16 + 2)))
    blocks = pool.get_new_blocks(4)
    assert blocks == [1, 2, 3, 4]
    pool.cache_full_blocks(blocks, request.block_hashes, 0, 2)
    assert len(pool.hash_to_block) == 2
    assert [pool.block_hash[b] for b in blocks] == [*request.block_hashes[:2], None, None]
    pool.cache_full_blocks(blocks, request.block_hashes, 2, 3)
    assert len(pool.hash_to_block) == 3
    assert pool.get_cached_block(request.block_hashes[2]) == 3
    pool.cache_full_blocks(blocks, request.block_hashes, 0, 3)  # idempotent
    assert len(pool.hash_to_block) == 3
    with pytest.raises(AssertionError, match="another prefix"):
        pool.cache_full_blocks([2], [b"other"], 0, 1)


def test_prefill_not_enough_free_blocks_with_computed_blocks() -> None:
    """#61: a failed allocation touches nothing: the hit blocks' ref counts are unchanged."""
    manager = _manager()
    pool = manager.block_pool
    req0 = make_request("0", COMMON)
    assert _allocate(manager, req0) == [1, 2, 3]
    block_part0 = list(req0.block_ids)

    req1 = make_request("1", COMMON * 2)
    hits, num_hit_tokens = manager.get_computed_blocks(req1)
    assert list(hits) == block_part0 and num_hit_tokens == 48
    manager.allocate_slots(req1, 48, num_hit_tokens, hits)
    block_part1 = list(req1.block_ids)
    manager.free(req1)
    assert {pool.ref_cnt[b] for b in block_part1[:3]} == {1}
    assert {pool.ref_cnt[b] for b in block_part1[3:]} == {0}

    req2 = make_request("2", [7] * 32)
    assert _allocate(manager, req2) is not None
    assert manager.get_num_free_blocks() == 5

    # req3 hits 6 blocks (3 of them free) and needs 3 new: 6 > 5 free.
    req3 = make_request("3", COMMON * 3)
    hits, num_hit_tokens = manager.get_computed_blocks(req3)
    assert list(hits) == block_part1 and num_hit_tokens == 96
    before = (list(pool.ref_cnt), _free_order(manager))
    assert manager.allocate_slots(req3, 48, num_hit_tokens, hits) is None
    assert {pool.ref_cnt[b] for b in block_part1[:3]} == {1}
    assert {pool.ref_cnt[b] for b in block_part1[3:]} == {0}
    assert (list(pool.ref_cnt), _free_order(manager)) == before
    assert not req3.block_ids


def test_reset_prefix_cache() -> None:
    """#62"""
    manager = _manager()
    req0 = make_request("0", COMMON + [3] * 7)
    assert _allocate(manager, req0) == [1, 2, 3, 4]
    req1 = make_request("1", COMMON + [4] * 7)
    hits, num_hit_tokens = manager.get_computed_blocks(req1)
    assert len(req1.block_hashes) == 3 and len(hits) == 3
    assert manager.allocate_slots(req1, 7, num_hit_tokens, hits) == [5]

    assert not manager.reset_prefix_cache()  # blocks still held
    assert manager.block_pool.hash_to_block

    manager.free(req0)
    manager.free(req1)
    assert manager.reset_prefix_cache()
    assert not manager.block_pool.hash_to_block
    assert all(h is None for h in manager.block_pool.block_hash)
    assert manager.get_computed_blocks(make_request("2", COMMON + [3] * 7)) == ([], 0)


def test_maybe_evict_cached_block() -> None:
    """#64: a hash shared by two blocks keeps its entry until both are evicted."""
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True)
    h0, h1, h2 = b"10", b"20", b"30"
    blocks = pool.get_new_blocks(4)
    assert blocks == [1, 2, 3, 4]
    # Identical content is not de-duplicated: blocks 3 and 4 both cache h2.
    pool.cache_full_blocks(blocks, [h0, h1, h2, h2], 0, 4)
    assert pool.hash_to_block == {h0: 1, h1: 2, h2: [3, 4]}
    assert pool.get_cached_block(h2) == 3  # lookups return the earliest inserted
    pool.free_blocks([2, 3, 4, 1])  # all hashed: appended in this order
    assert _pool_free(pool) == [2, 3, 4, 1]

    # Eviction is lazy: it happens as get_new_blocks pops blocks from the head.
    assert pool.get_new_blocks(1) == [2]
    assert pool.hash_to_block == {h0: 1, h2: [3, 4]}
    assert pool.get_new_blocks(1) == [3]
    assert pool.hash_to_block == {h0: 1, h2: 4}
    assert pool.get_cached_block(h2) == 4
    assert pool.get_new_blocks(1) == [4]
    assert pool.hash_to_block == {h0: 1}
    assert pool.get_new_blocks(1) == [1]
    assert pool.hash_to_block == {}
    assert all(h is None for h in pool.block_hash)
    assert_block_pool_consistent(pool, [[1, 2, 3, 4]])


def _pool_free(pool: BlockPool) -> list[int]:
    return pool.free_queue.get_all_free_blocks()


def test_full_prompt_hit_recomputes_the_last_block() -> None:
    """§2.5: the hit is capped at num_tokens - 1, rounded down to whole blocks."""
    manager = _manager()
    req0 = make_request("0", COMMON)
    _allocate(manager, req0)
    req1 = make_request("1", COMMON)  # exactly 3 cached blocks
    hits, num_hit_tokens = manager.get_computed_blocks(req1)
    assert list(hits) == [1, 2] and num_hit_tokens == 32
    req2 = make_request("2", [*COMMON, 5])  # 49 tokens: all 3 blocks hit
    assert manager.get_computed_blocks(req2)[1] == 48


def test_hit_on_the_first_of_several_blocks_with_the_same_hash() -> None:
    manager = _manager()
    req0 = make_request("0", [*COMMON, 3])
    req1 = make_request("1", [*COMMON, 3])
    _allocate(manager, req0)
    # req1 allocates its own copies (no lookup), so hash h_i maps to two blocks.
    manager.allocate_slots(req1, 49)
    assert req1.block_ids == [5, 6, 7, 8]
    assert manager.block_pool.hash_to_block[req0.block_hashes[0]] == [1, 5]
    hits, _ = manager.get_computed_blocks(make_request("2", [*COMMON, 4]))
    assert list(hits) == [1, 2, 3]


def test_full_sequence_must_fit_and_watermark() -> None:
    """§2.6 steps 2–3: the full-sequence gate and the watermark for waiting requests."""
    manager = _manager(num_blocks=6, watermark_blocks=1)  # 5 usable
    req = make_request("0", list(range(70)))  # 5 blocks
    assert manager.allocate_slots(req, 16, full_sequence_must_fit=True) is None
    assert not req.block_ids
    # Without other scheduled requests the watermark does not apply.
    assert manager.allocate_slots(
        req, 16, full_sequence_must_fit=True, has_scheduled_reqs=False
    ) == [1]
    manager.free(req)
    # A chunk of 16 tokens fits (1 + 1 watermark ≤ 5) when the whole sequence need not.
    # (Block 1 now caches req 0's first block: it was appended at the tail when freed.)
    req = make_request("1", list(range(100, 170)))
    assert manager.allocate_slots(req, 16) == [2]
    # RUNNING requests never pay the watermark.
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = 16
    assert manager.allocate_slots(req, 54) == [3, 4, 5, 1]
    assert manager.get_num_free_blocks() == 0


def test_allocate_running_slots_matches_allocate_slots() -> None:
    """The running fast path makes the same decisions as the general method."""
    for fast in (False, True):
        manager = _manager(num_blocks=6)
        req = make_request("0", list(range(40)))
        assert _allocate(manager, req) == [1, 2, 3]
        req.num_computed_tokens = 40
        req.status = RequestStatus.RUNNING
        for _ in range(30):
            req.append_output_token_id(1)
        alloc = manager.allocate_running_slots if fast else manager.allocate_slots
        assert alloc(req, 30) == [4, 5]
        assert req.num_cached_blocks == 4  # 64 of 70 tokens in full blocks
        req.num_computed_tokens = 70
        assert alloc(req, 30) is None  # 100 tokens need 7 blocks > 5
        assert req.block_ids == [1, 2, 3, 4, 5]


def test_prefix_cache_stats() -> None:
    manager = _manager()
    req = make_request("0", [*COMMON, 1])
    manager.record_prefix_cache_stats(req, 48)
    req.num_preemptions = 1
    manager.record_prefix_cache_stats(req, 32)
    s = manager.prefix_cache_stats
    assert (s.requests, s.queries, s.hits) == (1, 49, 48)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 49, 32)
    disabled = _manager(enable_caching=False)
    disabled.record_prefix_cache_stats(req, 0)
    assert disabled.prefix_cache_stats.requests == 0


def test_free_releases_in_reverse_order_and_null_block_is_never_used() -> None:
    pool = BlockPool(num_gpu_blocks=4, enable_caching=True)
    assert pool.get_num_free_blocks() == 3 and _pool_free(pool) == [1, 2, 3]
    assert pool.get_usage() == 0.0
    assert pool.get_new_blocks(3) == [1, 2, 3]
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.free_blocks([NULL_BLOCK_ID, 3, 2, 1])  # the null block is skipped
    assert _pool_free(pool) == [3, 2, 1]
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks([1])
    with pytest.raises(ValueError, match="null block"):
        BlockPool(num_gpu_blocks=1, enable_caching=True)


# -- the free queue (test_kv_cache_utils.py #68–69) ----------------------------------------------


def _links(queue: FreeBlockQueue, block_id: int) -> tuple[int, int]:
    return queue._prev[block_id], queue._next[block_id]


def test_free_kv_cache_block_queue_operations() -> None:
    """#68 (and #69 get_all_free_blocks, which follows the same operations)."""
    queue = FreeBlockQueue(range(5), 5)
    assert queue.num_free_blocks == 5
    assert queue.get_all_free_blocks() == [0, 1, 2, 3, 4]

    assert queue.popleft() == 0
    assert queue.num_free_blocks == 4
    assert queue.get_all_free_blocks() == [1, 2, 3, 4]

    queue.remove(2)
    assert queue.num_free_blocks == 3
    assert _links(queue, 1)[1] == 3 and _links(queue, 3)[0] == 1
    assert queue.get_all_free_blocks() == [1, 3, 4]

    queue.append(2)
    assert queue.num_free_blocks == 4
    assert queue.get_all_free_blocks() == [1, 3, 4, 2]
    assert _links(queue, 2)[0] == 4

    assert [queue.popleft() for _ in range(4)] == [1, 3, 4, 2]
    assert queue.num_free_blocks == 0
    assert queue.get_all_free_blocks() == []
    with pytest.raises(ValueError, match=r"^No free blocks available$"):
        queue.popleft()
    with pytest.raises(ValueError):
        queue.remove(1)  # popped blocks are no longer linked


def test_free_kv_cache_block_queue_append_n() -> None:
    """#69"""
    queue = FreeBlockQueue([], 6)
    queue.append_n([])
    assert queue.num_free_blocks == 0 and queue.get_all_free_blocks() == []
    queue.append_n([0])
    assert queue.get_all_free_blocks() == [0]
    queue.append_n([4, 5])
    assert queue.get_all_free_blocks() == [0, 4, 5]
    queue.append_n([1, 2, 3])
    assert queue.num_free_blocks == 6
    assert queue.get_all_free_blocks() == [0, 4, 5, 1, 2, 3]


def test_free_kv_cache_block_queue_prepend_n() -> None:
    """#69"""
    queue = FreeBlockQueue([0], 6)
    queue.prepend_n([])
    assert queue.get_all_free_blocks() == [0]
    queue.prepend_n([4, 5])
    assert queue.get_all_free_blocks() == [4, 5, 0]
    queue.prepend_n([1, 2])
    assert queue.num_free_blocks == 5
    assert queue.get_all_free_blocks() == [1, 2, 4, 5, 0]
    assert [queue.popleft() for _ in range(5)] == [1, 2, 4, 5, 0]
    queue.prepend_n([3])  # into an empty queue
    assert queue.get_all_free_blocks() == [3] and queue.num_free_blocks == 1


def test_free_kv_cache_block_queue_popleft_n() -> None:
    """#69"""
    queue = FreeBlockQueue([1, 3, 5, 4, 0, 2], 6)
    assert queue.num_free_blocks == 6
    assert queue.popleft_n(0) == []
    assert queue.popleft_n(1) == [1]
    assert queue.popleft_n(2) == [3, 5]
    assert queue.get_all_free_blocks() == [4, 0, 2]
    assert queue.popleft_n(3) == [4, 0, 2]
    assert queue.num_free_blocks == 0 and queue.get_all_free_blocks() == []
    with pytest.raises(ValueError):
        queue.popleft_n(1)
    queue.append_n([2, 0])
    assert queue.get_all_free_blocks() == [2, 0]


def test_popleft_n_unlinks_the_popped_blocks() -> None:
    queue = FreeBlockQueue(range(4), 4)
    popped = queue.popleft_n(2)
    assert popped == [0, 1]
    with pytest.raises(ValueError):
        queue.remove(0)  # not free any more: must be refused


# -- block hashing (#70) -------------------------------------------------------------------------


def test_none_hash_is_fixed() -> None:
    assert hashlib.sha256(b"twinserve-none-hash").digest() == NONE_HASH


def test_hash_block_tokens() -> None:
    parent = hashlib.sha256(b"parent").digest()
    tokens = [0, 1, 2, 2**40]
    expected = hashlib.sha256(parent + array("q", tokens).tobytes()).digest()
    assert hash_block_tokens(parent, tokens) == expected
    assert hash_block_tokens(parent, tokens) != hash_block_tokens(NONE_HASH, tokens)
    assert hash_block_tokens(parent, [1, 2]) != hash_block_tokens(parent, [2, 1])


def test_request_block_hasher() -> None:
    """#70: B=3, 6 tokens: exactly 2 chained hashes; a partial block is not hashed until full."""
    hasher = TokenBlockHasher(3)
    request = Request(
        "0", sampling_params=SamplingParams(), prompt_token_ids=[0, 1, 2, 3, 4, 5, 6],
        block_hasher=hasher,
    )
    h0 = hash_block_tokens(NONE_HASH, [0, 1, 2])
    h1 = hash_block_tokens(h0, [3, 4, 5])
    assert request.block_hashes == [h0, h1]
    request.append_output_token_id(7)
    assert len(request.block_hashes) == 2
    request.append_output_token_id(8)  # completes block 2 = [6, 7, 8]
    assert request.block_hashes == [h0, h1, hash_block_tokens(h1, [6, 7, 8])]
    assert request.append_sampled_token(9, max_model_len=100) is False
    assert len(request.block_hashes) == 3
    with pytest.raises(ValueError):
        TokenBlockHasher(0)


def test_equal_hashes_mean_equal_prefixes() -> None:
    a = make_request("a", [1] * 16 + [2] * 16)
    b = make_request("b", [3] * 16 + [2] * 16)
    assert a.block_hashes[1] != b.block_hashes[1]  # same tokens, different parent
    c = make_request("c", [1] * 16 + [2] * 16 + [9])
    assert c.block_hashes == a.block_hashes


def test_precomputed_block_hasher() -> None:
    """Trace-style requests: prompt keys given, generated blocks keyed per request."""
    hasher = PrecomputedBlockHasher(4, ["k0", "k1", "k2"], unique_id="r7")
    request = Request(
        "r7", sampling_params=SamplingParams(), num_prompt_tokens=10, block_hasher=hasher
    )
    assert request.block_hashes == ["k0", "k1"]  # only full prompt blocks
    assert not request.has_token_ids
    with pytest.raises(ValueError, match="carries no prompt token ids"):
        _ = request.all_token_ids
    for _ in range(6):
        request.append_output_token_id(0)
    assert request.block_hashes == ["k0", "k1", ("gen", "r7", 2), ("gen", "r7", 3)]


def test_precomputed_block_hasher_int_ids_give_distinct_negative_int_keys() -> None:
    """The simulator's int request indices key generated blocks by negative ints: distinct
    across requests and block indices, and never equal to a prompt key."""
    keys: list[object] = []
    for uid in (0, 1, 7):
        hasher = PrecomputedBlockHasher(4, [("pfx", 0, 0)], unique_id=uid)
        request = Request(
            str(uid), sampling_params=SamplingParams(), num_prompt_tokens=5, block_hasher=hasher
        )
        for _ in range(7):
            request.append_output_token_id(0)
        assert request.block_hashes[0] == ("pfx", 0, 0)
        generated = request.block_hashes[1:]
        assert len(generated) == 2 and all(type(k) is int and k < 0 for k in generated)
        keys.extend(generated)
    assert len(set(keys)) == len(keys) == 6


_HASH_IN_SUBPROCESS = """
import sys
from engine.core.hashing import NONE_HASH, TokenBlockHasher
from engine.core.request import Request, SamplingParams
r = Request("x", sampling_params=SamplingParams(), prompt_token_ids=list(range(50)),
            block_hasher=TokenBlockHasher(16))
print(NONE_HASH.hex(), *[h.hex() for h in r.block_hashes])
"""


@pytest.mark.parametrize("python_hash_seed", ["0", "12345"])
def test_block_hashes_are_deterministic_across_processes(python_hash_seed: str) -> None:
    """Hashes never depend on Python's randomized hash(): another process (another
    PYTHONHASHSEED) computes the same chain."""
    here = make_request("x", list(range(50)))
    result = subprocess.run(
        [sys.executable, "-c", _HASH_IN_SUBPROCESS],
        cwd=ROOT,
        env={"PYTHONHASHSEED": python_hash_seed, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    none_hash, *chain = result.stdout.split()
    assert none_hash == NONE_HASH.hex()
    assert chain == [h.hex() for h in here.block_hashes if isinstance(h, bytes)]
    assert len(chain) == 3
