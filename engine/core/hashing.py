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

Only *full* blocks are hashed. A hasher reads what it needs of a request (``TokenSource``: its
hashes so far and its tokens) and returns the hashes of the blocks completed since; the request
appends them (``Request.hash_full_blocks``). Hashers hold no per-request state of their own but
the workload's keys, and never write to a request.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Sequence
from typing import Final, Protocol

BlockHash = Hashable

#: Parent of the first block (vLLM hashes a fixed seed string for sha256 too).
NONE_HASH: bytes = hashlib.sha256(b"twinserve-none-hash").digest()


class TokenSource(Protocol):
    """What a hasher reads of a request (``Request`` has these)."""

    @property
    def block_hashes(self) -> Sequence[BlockHash]:
        """Hashes of its first full blocks, in order (the ones hashed so far)."""
        ...

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt + outputs."""
        ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + output token ids (raises ValueError for a request that carries none)."""
        ...


class BlockHasher(Protocol):
    """Hashes the full blocks a request's known tokens complete."""

    block_size: int

    def hash_new_blocks(self, request: TokenSource) -> list[BlockHash]:
        """The hashes of the full blocks after ``request.block_hashes`` (empty: none)."""
        ...


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

    def hash_new_blocks(self, request: TokenSource) -> list[BlockHash]:
        hashes = list(request.block_hashes)
        return self.hashes_after(hashes, request.all_token_ids, request.num_tokens)

    def hashes_after(
        self, block_hashes: list[BlockHash], token_ids: list[int], num_tokens: int
    ) -> list[BlockHash]:
        """The hashes of the full blocks of ``token_ids[:num_tokens]`` after ``block_hashes``
        (the request's own call: native when compiled, no protocol in between, and lists, whose
        indexing and slicing compile to list operations)."""
        bs = self.block_size
        parent = block_hashes[-1] if block_hashes else NONE_HASH
        new: list[BlockHash] = []
        for start in range(len(block_hashes) * bs, num_tokens - bs + 1, bs):
            assert isinstance(parent, bytes)
            parent = hash_block_tokens(parent, token_ids[start : start + bs])
            new.append(parent)
        return new


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

    def hash_new_blocks(self, request: TokenSource) -> list[BlockHash]:
        return self.keys(len(request.block_hashes), request.num_tokens, request.num_prompt_tokens)

    def num_given_keys(self, num_prompt_tokens: int) -> int:
        """How many of the request's first blocks take the workload's keys: its prompt's full
        blocks that have one; every block after them is keyed as generated."""
        return min(len(self.prompt_block_hashes), num_prompt_tokens // self.block_size)

    def private_from(self, block_index: int, num_prompt_tokens: int) -> bool:
        """Are the keys of blocks ``block_index`` and after all private (negative ints: past
        the given prompt keys, with an int ``unique_id``)? Another request can never hit
        such a block, nor can the hash map hold it before its request is preempted."""
        return self._int_keys and block_index >= self.num_given_keys(num_prompt_tokens)

    def keys(self, num_hashed: int, num_tokens: int, num_prompt_tokens: int) -> list[BlockHash]:
        """The keys of full blocks ``num_hashed`` .. ``num_tokens // block_size − 1`` (the
        request's own call: native when compiled, no protocol in between)."""
        i = num_hashed
        num_full = num_tokens // self.block_size
        if i >= num_full:
            return []
        new: list[BlockHash] = []
        given = self.prompt_block_hashes
        num_given = self.num_given_keys(num_prompt_tokens)
        if i < num_given:
            new.extend(given[i : min(num_full, num_given)])
            i += len(new)
            if i >= num_full:
                return new
        if self._int_keys:
            base = self._gen_base
            if num_full - i == 1:
                new.append(base + i)
            else:
                new.extend(range(base + i, base + num_full))
            return new
        uid = self.unique_id
        while i < num_full:
            new.append(("gen", uid, i))
            i += 1
        return new
