"""Per-request KV block tables on top of the block pool: prefix-cache hits, allocation, freeing.

This is vLLM V1's ``KVCacheManager`` for one full-attention KV cache group (SCHEDULER_SPEC
§2.5–2.7): a hit is the longest run of cached full blocks from the start, capped at
``num_tokens - 1`` tokens; ``allocate_slots`` grows a request's block table (optionally only if
its whole sequence fits, and keeping a watermark for admissions) and registers every newly full
block in the hash map right away, so a request admitted later in the *same* step can hit blocks
that an earlier one is only now computing. Nothing is touched when an allocation fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.block_pool import BlockPool
from engine.core.request import Request, RequestStatus

_EMPTY: tuple[int, ...] = ()


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups counted at admission (tokens), split by preempted or not."""

    requests: int = 0  # admissions that looked the cache up (not preempted before)
    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens found cached
    preempted_requests: int = 0  # the same, for requests resumed after a preemption
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheManager:
    """Block tables of live requests; the only writer of the block pool."""

    __slots__ = (
        "block_pool",
        "block_size",
        "enable_caching",
        "max_model_len",
        "num_cached_blocks",
        "prefix_cache_stats",
        "req_to_blocks",
        "watermark_blocks",
    )

    def __init__(
        self,
        *,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool,
        watermark_blocks: int = 0,
    ) -> None:
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.watermark_blocks = watermark_blocks
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # full blocks already in the hash map
        self.prefix_cache_stats = PrefixCacheStats()

    # -- queries --------------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_num_free_blocks(self) -> int:
        return self.block_pool.free_queue.num_free_blocks

    def get_block_ids(self, req_id: str) -> list[int]:
        return self.req_to_blocks.get(req_id, [])

    def get_computed_blocks(self, request: Request) -> tuple[Sequence[int], int]:
        """Longest cached prefix of whole blocks, leaving at least the last token to compute."""
        if not self.enable_caching:
            return _EMPTY, 0
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs
        hashes = request.block_hashes
        get = self.block_pool.hash_to_block.get
        hits: list[int] = []
        for i in range(min(max_blocks, len(hashes))):
            entry = get(hashes[i])
            if entry is None:
                break
            hits.append(entry if isinstance(entry, int) else entry[0])
        return hits, len(hits) * bs

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if self.enable_caching:
            self.prefix_cache_stats.record(
                request.num_tokens, num_hits, preempted=request.num_preemptions > 0
            )

    # -- allocation -----------------------------------------------------------------------------
    def _num_blocks_to_allocate(
        self, req_id: str, num_tokens: int, hit_blocks: Sequence[int]
    ) -> int:
        """New blocks needed to hold ``num_tokens``, plus hit blocks that sit in the free queue
        (touching them takes them out of it, so they count against the free capacity)."""
        held = self.req_to_blocks.get(req_id)
        num_held = len(held) if held is not None else 0
        need = -(-num_tokens // self.block_size) - num_held - len(hit_blocks)
        if need < 0:
            need = 0
        if hit_blocks:
            ref_cnt = self.block_pool.ref_cnt
            need += sum(1 for b in hit_blocks if ref_cnt[b] == 0)
        return need

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[int] = _EMPTY,
        *,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> list[int] | None:
        """Reserve KV slots for ``num_new_tokens`` more tokens of ``request``.

        ``new_computed_blocks`` (a prefix hit of ``num_new_computed_tokens`` tokens) are touched
        and prepended to the block table of a request that holds none yet. Returns the newly
        allocated block ids, or None (with no state changed) when they do not fit.
        """
        req_id = request.req_id
        max_model_len = self.max_model_len
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        if total_computed > max_model_len:
            total_computed = max_model_len
        watermark = 0
        if has_scheduled_reqs and (
            request.status == RequestStatus.WAITING or request.status == RequestStatus.PREEMPTED
        ):
            watermark = self.watermark_blocks
        num_free = self.block_pool.free_queue.num_free_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, max_model_len)
            needed = self._num_blocks_to_allocate(req_id, full, new_computed_blocks)
            if needed + watermark > num_free:
                return None
        num_tokens_need_slot = total_computed + num_new_tokens
        if num_tokens_need_slot > max_model_len:
            num_tokens_need_slot = max_model_len
        held = self.req_to_blocks.get(req_id)
        if held is not None and not new_computed_blocks:
            # Running request: the common decode fast path.
            num_new_blocks = -(-num_tokens_need_slot // self.block_size) - len(held)
            if num_new_blocks < 0:
                num_new_blocks = 0
            if num_new_blocks + watermark > num_free:
                return None
        else:
            needed = self._num_blocks_to_allocate(req_id, num_tokens_need_slot, new_computed_blocks)
            if needed + watermark > num_free:
                return None
            if held is None:
                held = self.req_to_blocks[req_id] = []
            if new_computed_blocks:
                self.block_pool.touch(new_computed_blocks)
                held.extend(new_computed_blocks)
                self.num_cached_blocks[req_id] = len(held)
            num_new_blocks = -(-num_tokens_need_slot // self.block_size) - len(held)
        new_blocks: list[int] = []
        if num_new_blocks > 0:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            held.extend(new_blocks)
        if self.enable_caching:
            num_tokens_to_cache = total_computed + num_new_tokens
            if num_tokens_to_cache > request.num_tokens:
                num_tokens_to_cache = request.num_tokens
            self.cache_blocks(request, num_tokens_to_cache)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's full blocks covering its first ``num_tokens`` tokens."""
        req_id = request.req_id
        num_cached = self.num_cached_blocks.get(req_id, 0)
        num_hashed = len(request.block_hashes)
        num_full = num_tokens // self.block_size
        if num_full > num_hashed:
            num_full = num_hashed
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[req_id], request.block_hashes, num_cached, num_full
        )
        self.num_cached_blocks[req_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first (deepest blocks are evicted first)."""
        blocks = self.req_to_blocks.pop(request.req_id, None)
        self.num_cached_blocks.pop(request.req_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
