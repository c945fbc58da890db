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
    """Block tables of live requests; the only writer of the block pool.

    Each request's block table lives on the request (``request.block_ids``, with
    ``request.num_cached_blocks`` counting its leading blocks already in the hash map) so the
    per-step decode path needs no dictionary lookups; this manager is their only writer.
    """

    __slots__ = (
        "block_pool",
        "block_size",
        "enable_caching",
        "max_model_len",
        "prefix_cache_stats",
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
        self.prefix_cache_stats = PrefixCacheStats()

    # -- queries --------------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_num_free_blocks(self) -> int:
        return self.block_pool.free_queue.num_free_blocks

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
        self, request: Request, num_tokens: int, hit_blocks: Sequence[int]
    ) -> int:
        """New blocks needed to hold ``num_tokens``, plus hit blocks that sit in the free queue
        (touching them takes them out of it, so they count against the free capacity)."""
        need = -(-num_tokens // self.block_size) - len(request.block_ids) - len(hit_blocks)
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
        and put at the start of the block table of a request that holds none yet. With
        ``full_sequence_must_fit`` the request's whole current sequence must fit first. A
        watermark of free blocks is kept for WAITING/PREEMPTED requests when others are
        scheduled. Returns the newly allocated block ids, or None with nothing changed.
        """
        if not self.slots_fit(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            full_sequence_must_fit=full_sequence_must_fit,
            has_scheduled_reqs=has_scheduled_reqs,
            num_free_blocks=self.block_pool.free_queue.num_free_blocks,
        ):
            return None
        max_model_len = self.max_model_len
        total_computed = min(request.num_computed_tokens + num_new_computed_tokens, max_model_len)
        num_tokens_need_slot = min(total_computed + num_new_tokens, max_model_len)
        held = request.block_ids
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            held.extend(new_computed_blocks)
            request.num_cached_blocks = len(held)
        num_new_blocks = -(-num_tokens_need_slot // self.block_size) - len(held)
        new_blocks: list[int] = []
        if num_new_blocks > 0:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            held.extend(new_blocks)
        if self.enable_caching:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def slots_fit(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: Sequence[int],
        *,
        full_sequence_must_fit: bool,
        has_scheduled_reqs: bool,
        num_free_blocks: int,
    ) -> bool:
        """Would ``allocate_slots`` with these arguments succeed with ``num_free_blocks`` free
        blocks? (Its own test; read-only, so the bulk path can ask ahead.)"""
        max_model_len = self.max_model_len
        total_computed = min(request.num_computed_tokens + num_new_computed_tokens, max_model_len)
        watermark = 0
        if has_scheduled_reqs and (
            request.status == RequestStatus.WAITING or request.status == RequestStatus.PREEMPTED
        ):
            watermark = self.watermark_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, max_model_len)
            if self._num_blocks_to_allocate(request, full, new_computed_blocks) + watermark > (
                num_free_blocks
            ):
                return False
        num_tokens_need_slot = min(total_computed + num_new_tokens, max_model_len)
        needed = self._num_blocks_to_allocate(request, num_tokens_need_slot, new_computed_blocks)
        return needed + watermark <= num_free_blocks

    def allocate_running_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """``allocate_slots`` for a RUNNING request: no prefix hit, no gate, no watermark.

        The scheduler's per-step hot path; decisions identical to the general method.
        """
        total = request.num_computed_tokens
        max_model_len = self.max_model_len
        if total > max_model_len:
            total = max_model_len
        total += num_new_tokens
        num_slots = total if total < max_model_len else max_model_len
        held = request.block_ids
        need = -(-num_slots // self.block_size) - len(held)
        new_blocks: list[int]
        if need > 0:
            if need > self.block_pool.free_queue.num_free_blocks:
                return None
            new_blocks = self.block_pool.get_new_blocks(need)
            held.extend(new_blocks)
        else:
            new_blocks = []
        if self.enable_caching:
            num_full = (total if total < request.num_tokens else request.num_tokens) // (
                self.block_size
            )
            if num_full > request.num_cached_blocks:
                self.cache_blocks(request, num_full * self.block_size)
        return new_blocks

    def append_blocks(self, request: Request, num_blocks: int) -> None:
        """Append ``num_blocks`` new blocks to the request's table, unchecked: the bulk path's
        allocation (``engine/core/bulk``), which has bounded its blocks by the free ones."""
        request.block_ids.extend(self.block_pool.get_new_blocks(num_blocks))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's full blocks covering its first ``num_tokens`` tokens
        (nothing when prefix caching is off)."""
        if not self.enable_caching:
            return
        num_cached = request.num_cached_blocks
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            request.block_ids, request.block_hashes, num_cached, num_full
        )
        request.num_cached_blocks = num_full

    def free_preempted(self, request: Request) -> None:
        """``free`` for a request that will be admitted again: its private block hashes enter
        the hash map first, so its readmission can hit them (see ``block_pool``)."""
        if self.enable_caching and request.num_cached_blocks:
            self.block_pool.publish_private(
                request.block_ids, request.block_hashes, request.num_cached_blocks
            )
        self.free(request)

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first (deepest blocks are evicted first)."""
        blocks = request.block_ids
        request.block_ids = []
        request.num_cached_blocks = 0
        if blocks:
            self.block_pool.free_table(blocks)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()
