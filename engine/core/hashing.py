"""Block hashes for prefix caching: chained over full blocks, deterministic across processes.

A block hash identifies "this block's tokens *and everything before them*", so equal hashes mean
an equal prefix. Two sources feed the same KV cache manager:

* ``TokenBlockHasher`` — for requests with real token ids: ``h_i = SHA-256(h_{i-1} || tokens_i)``
  with a fixed seed for ``h_{-1}`` (never Python's randomized ``hash()``), like vLLM's
  ``sha256`` block hasher.
* ``PrecomputedBlockHasher`` — for simulated requests and traces that carry only prompt lengths
  and prefix identities (e.g. Mooncake ``hash_ids``): the workload supplies one hashable key per
  full prompt block (already prefix-chained by construction); blocks that contain generated tokens
  get keys unique to the request, since placeholder outputs are never shared.

Only *full* blocks are hashed; a hasher extends ``request.block_hashes`` when tokens complete a
block.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from engine.core.request import Request

BlockHash = Hashable

#: Parent of the first block (vLLM hashes a fixed seed string for sha256 too).
NONE_HASH: bytes = hashlib.sha256(b"twinserve-none-hash").digest()


class BlockHasher(Protocol):
    """Extends a request's ``block_hashes`` to cover all of its full blocks."""

    block_size: int

    def extend(self, request: Request) -> None: ...


def hash_block_tokens(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """SHA-256 of the parent hash followed by the block's token ids as little-endian int64."""
    h = hashlib.sha256(parent)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class TokenBlockHasher:
    """Chained SHA-256 over the token ids of each full block (one instance per engine)."""

    __slots__ = ("block_size",)

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size

    def extend(self, request: Request) -> None:
        bs = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        parent = hashes[-1] if hashes else NONE_HASH
        for start in range(len(hashes) * bs, request.num_tokens - bs + 1, bs):
            assert isinstance(parent, bytes)
            parent = hash_block_tokens(parent, tokens[start : start + bs])
            hashes.append(parent)


#: Bits of a generated block's index inside its int key (``PrecomputedBlockHasher``).
_GEN_INDEX_BITS: Final = 32


class PrecomputedBlockHasher:
    """Prompt block keys given by the workload; generated blocks keyed uniquely per request.

    ``prompt_block_hashes[i]`` must identify the prefix ending at block ``i`` (as trace hash ids
    and the simulator's shared-prefix generator do). Keys past the prompt's full blocks are
    unique per ``(unique_id, block_index)``, so they can never collide with another request's
    blocks as long as ``unique_id`` is unique among the engine's requests: a negative int when
    ``unique_id`` is a non-negative int (cheap to hash: the simulator's case; prompt keys must
    then not be negative ints), else the tuple ``("gen", unique_id, block_index)``. Negative-int
    keys are *private* to their request: the block pool maps them only when it is preempted
    (``block_pool``), so another request could never hit them.
    """

    __slots__ = ("_gen_base", "_int_keys", "block_size", "prompt_block_hashes", "unique_id")

    def __init__(
        self, block_size: int, prompt_block_hashes: Sequence[BlockHash], unique_id: Hashable
    ) -> None:
        self.block_size = block_size
        self.prompt_block_hashes = prompt_block_hashes
        self.unique_id = unique_id
        # int keys: base + block index (block index < 2**32, so keys never collide)
        uid = unique_id if type(unique_id) is int else -1  # plain ints only (no bool)
        self._int_keys = uid >= 0
        self._gen_base = -((uid + 1) << _GEN_INDEX_BITS) if uid >= 0 else 0

    def extend(self, request: Request) -> None:
        bs = self.block_size
        hashes = request.block_hashes
        num_full = request.num_tokens // bs
        i = len(hashes)
        if i >= num_full:
            return
        given = self.prompt_block_hashes
        num_given = min(len(given), request.num_prompt_tokens // bs)
        if i < num_given:
            hashes.extend(given[i : min(num_full, num_given)])
            i = len(hashes)
            if i >= num_full:
                return
        if self._int_keys:
            base = self._gen_base
            if num_full - i == 1:
                hashes.append(base + i)
            else:
                hashes.extend(range(base + i, base + num_full))
            return
        uid = self.unique_id
        while i < num_full:
            hashes.append(("gen", uid, i))
            i += 1
