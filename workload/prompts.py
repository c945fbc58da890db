"""Token ids for a workload: what a measured run sends where the simulator needs only lengths.

Seeded random tokens of the model's vocabulary with the workload's prompt lengths and prefix
structure: requests of one shared prefix start with the same tokens, and Mooncake prefix
identities (``hash_ids``, one per 512-token block) become shared token blocks, so the real
engine's prefix cache sees what the simulated one does.
"""

from __future__ import annotations

import numpy as np

from workload.stream import Workload
from workload.traces import MOONCAKE_BLOCK_TOKENS

#: Tokens below this id are left out of synthetic prompts (special tokens live there).
FIRST_PLAIN_TOKEN = 16


def synthetic_prompts(w: Workload, vocab_size: int, seed: int) -> list[list[int]]:
    """Deterministic token ids with the workload's lengths and prefix structure."""
    rng = np.random.default_rng(seed)
    low, high = min(FIRST_PLAIN_TOKEN, vocab_size - 1), vocab_size
    prefixes: dict[int, np.ndarray] = {}
    chunks: dict[int, np.ndarray] = {}
    prompts = []
    for i in range(len(w)):
        n = int(w.prompt_lens[i])
        if w.hash_ids is not None:
            parts = []
            for h in w.hash_ids[i]:
                if h not in chunks:
                    chunks[h] = rng.integers(low, high, MOONCAKE_BLOCK_TOKENS)
                parts.append(chunks[h])
            ids = np.concatenate(parts)[:n] if parts else np.empty(0, dtype=np.int64)
            if len(ids) < n:
                ids = np.concatenate([ids, rng.integers(low, high, n - len(ids))])
        else:
            pid, plen = int(w.shared_prefix_ids[i]), int(w.shared_prefix_lens[i])
            head = np.empty(0, dtype=np.int64)
            if pid >= 0 and plen:
                if pid not in prefixes:
                    prefixes[pid] = rng.integers(low, high, plen)
                head = prefixes[pid][: min(plen, n)]
            ids = np.concatenate([head, rng.integers(low, high, n - len(head))])
        prompts.append([int(t) for t in ids])
    return prompts
