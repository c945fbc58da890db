"""An API server's view of which prompt prefixes each EngineCore has seen, for prefix-aware
routing with data parallelism.

A server cannot look into an engine's prefix cache, so it remembers the chained hashes of the
full KV blocks of the prompts it sent to each engine (the last ``capacity`` of them per
engine, least recently used first out) and counts how many leading blocks of a new prompt an
engine has seen. Hashes chain like the engine's block hashes (each covers its block and every
block before it), so a hit on block ``k`` means the whole prefix up to it matched. An
estimate: the engine may have evicted a block since, and other API servers' requests are not
seen.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: Block hashes remembered per engine.
DEFAULT_CAPACITY = 200_000


class PrefixIndex:
    """Per engine, the chained hashes of full prompt blocks this server routed there."""

    def __init__(self, num_engines: int, block_size: int,
                 capacity: int = DEFAULT_CAPACITY) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_engines)]

    def block_hashes(self, token_ids: Sequence[int]) -> list[int]:
        """One chained hash per full block of ``token_ids``."""
        out: list[int] = []
        parent = 0
        size = self.block_size
        for start in range(0, len(token_ids) - size + 1, size):
            parent = hash((parent, tuple(token_ids[start:start + size])))
            out.append(parent)
        return out

    def cached_tokens(self, engine: int, hashes: Sequence[int]) -> int:
        """Leading tokens of the prompt whose blocks ``engine`` has seen."""
        seen = self._seen[engine]
        n = 0
        for h in hashes:
            if h not in seen:
                break
            n += 1
        return n * self.block_size

    def add(self, engine: int, hashes: Sequence[int]) -> None:
        seen = self._seen[engine]
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.capacity:
            seen.popitem(last=False)
