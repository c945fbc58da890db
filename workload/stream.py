"""``Workload``: a request stream as columns (numpy arrays, one entry per request, in send order).

Columns rather than objects, so a million requests cost tens of megabytes, not gigabytes. Both
worlds read the same columns: the simulator turns each row into a core ``Request`` with
precomputed block hashes (``prompt_block_keys``), a measured run into token ids
(``workload.prompts``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.core.slo import SLOClass
from workload.traces import MOONCAKE_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class Workload:
    """A request stream in send order (all arrays have one entry per request)."""

    send_time_s: np.ndarray  # float64, nondecreasing, first may be > 0
    prompt_lens: np.ndarray  # int64, >= 1
    output_lens: np.ndarray  # int64, >= 1 (requests stop there, as with ignore_eos)
    priorities: np.ndarray  # int64
    shared_prefix_ids: np.ndarray  # int64, -1 = no shared prefix
    shared_prefix_lens: np.ndarray  # int64, tokens of the shared prefix
    max_concurrency: int | None
    source: str  # provenance for reports (dataset, file, licence note)
    # Mooncake-style prefix identities: per request, one id per ``hash_block_tokens`` tokens.
    hash_ids: list[tuple[int, ...]] | None = None
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    request_rate: float = math.inf
    burstiness: float = 1.0
    extra: dict[str, object] = field(default_factory=dict)
    # who sent each request: an index into ``tenants`` (None: no tenants)
    tenant_ids: np.ndarray | None = None
    tenants: tuple[str, ...] = ()
    # each request's SLO class: an index into ``slo_classes`` (None: no SLOs)
    slo_class_ids: np.ndarray | None = None
    slo_classes: tuple[SLOClass, ...] = ()

    def __len__(self) -> int:
        return len(self.prompt_lens)

    @property
    def has_labels(self) -> bool:
        """Do requests carry a tenant or an SLO class?"""
        return self.tenant_ids is not None or self.slo_class_ids is not None

    @property
    def has_slos(self) -> bool:
        """Does every request carry an SLO class?"""
        return self.slo_class_ids is not None

    def tenant(self, index: int) -> str:
        """Request ``index``'s tenant ("" when the workload has none)."""
        ids = self.tenant_ids
        return "" if ids is None else self.tenants[int(ids[index])]

    def slo_class(self, index: int) -> SLOClass | None:
        """Request ``index``'s SLO class (None when the workload has none)."""
        ids = self.slo_class_ids
        return None if ids is None else self.slo_classes[int(ids[index])]

    def has_prompt_block_keys(self) -> bool:
        """Can ``prompt_block_keys`` list a key for any request (prefix ids from the trace, or
        a shared prefix)? If not, every request's prompt blocks are its own."""
        return self.hash_ids is not None or bool((self.shared_prefix_ids >= 0).any())

    def prompt_block_keys(self, index: int, block_size: int) -> Sequence[Hashable]:
        """Prefix identity of each full prompt block of request ``index`` that it may share.

        Blocks not listed (past the shared part) are unique to the request. A key is a
        non-negative int (cheap to hash, as ``PrecomputedBlockHasher`` wants prompt keys):
        ``(prefix << 33) | (block << 1) | kind``, where ``prefix`` is the trace's hash id of
        the block's last token (kind 0; ``_natural`` maps a negative id to an odd number) or
        the shared prefix's id (kind 1), and ``block`` is the block's index (< 2**32), so two
        keys are equal exactly when kind, prefix and block are.
        """
        n_full = int(self.prompt_lens[index]) // block_size
        if self.hash_ids is not None:
            ids = self.hash_ids[index]
            hb = self.hash_block_tokens
            # block i ends at token (i + 1) * block_size - 1, inside hash block
            # ((i + 1) * block_size - 1) // hb: the blocks up to the end of the listed ids
            count = min(n_full, len(ids) * hb // block_size)
            if hb % block_size:
                return [(_natural(ids[((i + 1) * block_size - 1) // hb]) << 33) | (i << 1)
                        for i in range(count)]
            # blocks j·per .. (j + 1)·per − 1 lie in hash block j: a range of keys each
            per = hb // block_size
            keys: list[int] = []
            for j in range(-(-count // per)):
                first = (_natural(ids[j]) << 33) + 2 * j * per
                keys.extend(range(first, first + 2 * per, 2))
            del keys[count:]
            return keys
        pid = int(self.shared_prefix_ids[index])
        if pid < 0:
            return ()
        n_shared = min(int(self.shared_prefix_lens[index]) // block_size, n_full)
        base = (pid << 33) | 1
        return [base | (i << 1) for i in range(n_shared)]


def _natural(hash_id: int) -> int:
    """A trace's hash id as a distinct non-negative int (0, 1, 2 … → 0, 2, 4 …; −1, −2 … →
    1, 3 …)."""
    return 2 * hash_id if hash_id >= 0 else -2 * hash_id - 1
