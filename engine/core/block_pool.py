"""KV blocks: reference counts, the free queue (vLLM's LRU order) and the prefix-hash map.

Blocks are plain integer ids ``0..num_gpu_blocks-1``; block 0 is the reserved *null block*,
taken out at start-up and never handed to a request, so allocation starts at id 1.

Invariants (checked by the property tests):

* a block is in the free queue exactly when its ``ref_cnt`` is 0 (the null block excepted);
* ``num_free_blocks + blocks held (ref_cnt > 0) == num_gpu_blocks - 1``;
* a block carries at most one hash; the hash map lists every (hash, block) pair exactly once
  (private pairs once published, below) and may hold several blocks per hash (identical content
  is not de-duplicated; lookups return the earliest-inserted block still cached);
* eviction is lazy: a freed cached block keeps its hash while it sits in the free queue and
  loses it only when ``get_new_blocks`` pops it for reuse, or on ``reset_prefix_cache``.

*Private* hashes — negative ints, the keys ``PrecomputedBlockHasher`` gives blocks unique to one
request — can only ever be looked up by the request that registered them, and only after it was
preempted (a first admission cannot hit them: nothing registered them yet). Such a block enters
the hash map only when its request is preempted (``publish_private``), in its registration
order, so every lookup sees exactly what an eager map would show; ``in_map[b]`` says whether
block ``b`` is in the map. This saves a map insertion and deletion per generated block. Until
then the block carries ``PRIVATE_HASH`` rather than its own key (the key stays in its request's
``block_hashes``, which ``publish_private`` reads): hashed like any other block for the
free-queue order, but holding no key of its own, so a request's keys are freed with the
request, together, instead of one at a time, each a cache miss, as their blocks are reused
(100,000 requests of the million-request stream: 8.6% less CPU in the simulation loop).

Free-queue order (SCHEDULER_SPEC §2.7): freed blocks without a hash are *prepended* (reused
first, LIFO), freed hashed blocks are *appended* (reused last, LRU); a prefix hit on a free
cached block removes it from the middle of the queue in O(1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, cast

from engine.core.hashing import BlockHash

NULL_BLOCK_ID: Final = 0

#: What a block registered under a private hash carries until its request publishes it (see
#: the module): a private hash itself, so that every rule for private hashes holds for it.
PRIVATE_HASH: Final = -1


def is_private(block_hash: BlockHash) -> bool:
    """Is ``block_hash`` a private hash (a negative int: ``PrecomputedBlockHasher``)?"""
    return isinstance(block_hash, int) and block_hash < 0


def _objects(ids: list[int]) -> list[object]:
    """The same list, typed so that a compiled build reads its items without unboxing."""
    return cast(list[object], ids)


class FreeBlockQueue:
    """Doubly linked list of free block ids; the head is reused first.

    Implemented over two integer arrays (``prev``/``next``) with head and tail sentinels, so
    ``remove`` of an arbitrary block, and pushes and pops at both ends, are O(1).
    """

    __slots__ = ("_head", "_next", "_prev", "_tail", "num_free_blocks")

    def __init__(self, block_ids: Sequence[int], capacity: int) -> None:
        self._head = capacity  # sentinel ids live past the block ids
        self._tail = capacity + 1
        self._next = [-1] * (capacity + 2)
        self._prev = [-1] * (capacity + 2)
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self.num_free_blocks = 0
        self.append_n(list(block_ids))

    def popleft(self) -> int:
        first = self._next[self._head]
        if first == self._tail:
            raise ValueError("No free blocks available")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[int]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} free")
        nxt, prv = self._next, self._prev
        # Block ids move between lists as the int objects they are (``_objects``): a compiled
        # build would otherwise box every id again, allocating an int per block per move.
        links = _objects(nxt)
        out: list[object] = []
        cur_obj = links[self._head]
        for _ in range(n):
            out.append(cur_obj)
            cur = cast(int, cur_obj)
            cur_obj = links[cur]
            nxt[cur] = -1  # popped blocks are linked to nothing
            prv[cur] = -1
        links[self._head] = cur_obj
        prv[cast(int, cur_obj)] = self._head
        self.num_free_blocks -= n
        return cast(list[int], out)

    def peek_n(self, n: int) -> list[int]:
        """The first ``n`` free blocks (what ``popleft_n(n)`` would return), left in place."""
        nxt, tail = self._next, self._tail
        out: list[int] = []
        cur = nxt[self._head]
        while len(out) < n and cur != tail:
            out.append(cur)
            cur = nxt[cur]
        return out

    def remove(self, block_id: int) -> None:
        self._unlink(block_id)

    def append(self, block_id: int) -> None:
        self.append_n([block_id])

    def append_n(self, block_ids: list[int]) -> None:
        nxt, prv, tail = _objects(self._next), _objects(self._prev), self._tail
        last = prv[tail]
        for b in _objects(block_ids):
            nxt[cast(int, last)] = b
            prv[cast(int, b)] = last
            last = b
        self._next[cast(int, last)] = tail
        prv[tail] = last
        self.num_free_blocks += len(block_ids)

    def prepend_n(self, block_ids: list[int]) -> None:
        """Put ``block_ids`` at the head, keeping their order (the first is reused first)."""
        if not block_ids:
            return
        nxt, prv = _objects(self._next), _objects(self._prev)
        first = nxt[self._head]
        prev = prv[cast(int, first)]  # the head sentinel's id, as stored
        for b in _objects(block_ids):
            nxt[cast(int, prev)] = b
            prv[cast(int, b)] = prev
            prev = b
        nxt[cast(int, prev)] = first
        prv[cast(int, first)] = prev
        self.num_free_blocks += len(block_ids)

    def get_all_free_blocks(self) -> list[int]:
        out = []
        nxt, cur = self._next, self._next[self._head]
        while cur != self._tail:
            out.append(cur)
            cur = nxt[cur]
        return out

    def _unlink(self, block_id: int) -> None:
        nxt, prv = self._next, self._prev
        p, n = prv[block_id], nxt[block_id]
        if p < 0 or n < 0:
            raise ValueError(f"block {block_id} is not in the free queue")
        nxt[p] = n
        prv[n] = p
        nxt[block_id] = prv[block_id] = -1
        self.num_free_blocks -= 1


class BlockPool:
    """Owns every KV block: who references it, whether it is free, which prefix it caches."""

    __slots__ = (
        "block_hash",
        "enable_caching",
        "free_queue",
        "hash_to_block",
        "in_map",
        "num_gpu_blocks",
        "ref_cnt",
    )

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be >= 2 (null block + one), got {num_gpu_blocks}"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_gpu_blocks
        # hash -> block id, or a list of block ids (insertion order) when several share it.
        self.hash_to_block: dict[BlockHash, int | list[int]] = {}
        self.in_map = [False] * num_gpu_blocks  # is the block's hash in hash_to_block?
        self.free_queue = FreeBlockQueue(range(num_gpu_blocks), num_gpu_blocks)
        null = self.free_queue.popleft()
        assert null == NULL_BLOCK_ID

    # -- queries --------------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks referenced by requests (1 - free / usable)."""
        return 1.0 - self.free_queue.num_free_blocks / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        """The earliest-inserted cached block under ``block_hash`` (private hashes: once
        published), or None."""
        entry = self.hash_to_block.get(block_hash)
        if entry is None or isinstance(entry, int):
            return entry
        return entry[0]

    # -- allocation -----------------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their stale hashes."""
        if num_blocks > self.free_queue.num_free_blocks:
            raise ValueError(
                f"cannot get {num_blocks} blocks: {self.free_queue.num_free_blocks} free"
            )
        blocks = self.free_queue.popleft_n(num_blocks)
        ref_cnt, block_hash, in_map = self.ref_cnt, self.block_hash, self.in_map
        table = self.hash_to_block
        for b in blocks:
            if in_map[b]:
                h = block_hash[b]
                entry = table.pop(h)  # (in the map: ``in_map``) one lookup, not two
                if isinstance(entry, int) and entry == b:  # usual: the only block under its hash
                    block_hash[b] = None
                    in_map[b] = False
                else:
                    table[h] = entry  # several blocks share the hash: put it back, evict one
                    self._evict(b)
            else:
                block_hash[b] = None  # unhashed, or a private hash never published
            ref_cnt[b] = 1
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Add a reference to prefix-hit blocks, taking free ones out of the free queue."""
        ref_cnt = self.ref_cnt
        for b in blocks:
            if ref_cnt[b] == 0:
                self.free_queue.remove(b)
            ref_cnt[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block; ``ordered_blocks`` lists eviction priority.

        Blocks reaching zero references go to the head of the free queue if they carry no hash
        (or caching is off) and to the tail otherwise, each group in the given order.
        """
        blocks = ordered_blocks if isinstance(ordered_blocks, list) else list(ordered_blocks)
        self._free_in_order(blocks, 0, len(blocks), 1)

    def free_table(self, block_ids: list[int]) -> None:
        """``free_blocks`` of a request's block table, last block first (its deepest blocks
        are evicted first), without copying it."""
        self._free_in_order(block_ids, len(block_ids) - 1, -1, -1)

    def _free_in_order(self, blocks: list[int], first: int, stop: int, step: int) -> None:
        ref_cnt, block_hash, caching = self.ref_cnt, self.block_hash, self.enable_caching
        ids = _objects(blocks)  # moved as the int objects they are (see popleft_n)
        evict_first: list[object] = []
        evict_last: list[object] = []
        j = first
        while j != stop:
            b_obj = ids[j]
            b = cast(int, b_obj)
            j += step
            cnt = ref_cnt[b]
            if cnt == 1:  # the usual case: the last holder lets go
                ref_cnt[b] = 0
                if caching and block_hash[b] is not None:
                    evict_last.append(b_obj)
                else:
                    evict_first.append(b_obj)
            elif cnt > 1:
                ref_cnt[b] = cnt - 1
            elif b != NULL_BLOCK_ID:
                raise AssertionError(f"double free of block {b}")
        if evict_first:
            self.free_queue.prepend_n(cast(list[int], evict_first))
        if evict_last:
            self.free_queue.append_n(cast(list[int], evict_last))

    # -- prefix cache ---------------------------------------------------------------------------
    def cache_full_blocks(
        self,
        blocks: list[int],
        block_hashes: list[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register ``blocks[num_cached_blocks:num_full_blocks]`` under their hashes (block
        counts, not negative; the two slices must be equally long: otherwise ValueError and
        nothing is registered)."""
        if num_cached_blocks < 0 or num_full_blocks < 0:
            raise ValueError(
                f"cache_full_blocks: block counts must be >= 0, got {num_cached_blocks} and "
                f"{num_full_blocks}"
            )
        num_blocks = max(min(num_full_blocks, len(blocks)) - num_cached_blocks, 0)
        num_hashes = max(min(num_full_blocks, len(block_hashes)) - num_cached_blocks, 0)
        if num_blocks != num_hashes:  # the lengths of the two slices
            raise ValueError(
                f"cache_full_blocks: blocks[{num_cached_blocks}:{num_full_blocks}] and their "
                f"hashes differ in length ({len(blocks)} blocks, {len(block_hashes)} hashes)"
            )
        block_hash = self.block_hash
        for i in range(num_cached_blocks, num_cached_blocks + num_blocks):
            b = blocks[i]
            h = block_hashes[i]
            current = block_hash[b]
            if current is not None:
                if current == h or (current == PRIVATE_HASH and is_private(h)):
                    continue
                raise AssertionError(f"block {b} already caches another prefix")
            if is_private(h):  # mapped, with its key, by publish_private
                block_hash[b] = PRIVATE_HASH
            else:
                block_hash[b] = h
                self._map(b, h)

    def publish_private(
        self, blocks: list[int], block_hashes: list[BlockHash], num_cached_blocks: int
    ) -> None:
        """Put the private hashes of a preempted request's registered blocks
        (``blocks[:num_cached_blocks]``, before they are freed; their keys
        ``block_hashes[:num_cached_blocks]``, the request's own) into the hash map, so that it
        can hit them when it is admitted again."""
        block_hash, in_map = self.block_hash, self.in_map
        for i in range(num_cached_blocks):
            b = blocks[i]
            if block_hash[b] == PRIVATE_HASH and not in_map[b]:
                h = block_hashes[i]
                block_hash[b] = h
                self._map(b, h)

    def _map(self, b: int, h: BlockHash) -> None:
        """Add (h, b) to the hash map, after the blocks already there under ``h``."""
        table = self.hash_to_block
        entry = table.setdefault(h, b)  # one lookup when the hash is new, the usual case
        if isinstance(entry, int):
            if entry != b:
                table[h] = [entry, b]
        elif b not in entry:
            entry.append(b)
        self.in_map[b] = True  # (already True where (h, b) was in the map)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any block is referenced."""
        if self.free_queue.num_free_blocks != self.num_gpu_blocks - 1:
            return False
        self.hash_to_block = {}
        self.block_hash = [None] * self.num_gpu_blocks
        self.in_map = [False] * self.num_gpu_blocks
        return True

    def _evict(self, block_id: int) -> None:
        h = self.block_hash[block_id]
        self.block_hash[block_id] = None
        self.in_map[block_id] = False
        entry = self.hash_to_block.get(h)
        if entry is None:
            return
        if isinstance(entry, int):
            if entry == block_id:
                del self.hash_to_block[h]
            return
        if block_id in entry:
            entry.remove(block_id)
        if len(entry) == 1:
            self.hash_to_block[h] = entry[0]
