"""The model's attention op over the paged KV cache, through the kernels' backend switch.

Responsibility: one call per decoder layer that (1) writes this step's new K/V rows into their
cache slots and (2) runs causal varlen attention of the step's queries over each sequence's
cached context, on the backend chosen once at start-up (``kernels.select_backend``: Triton on
CUDA, the plain-torch reference on CPU, the Triton interpreter when asked).

``AttentionMetadata`` is built once per step by the model runner and shared by every layer. Its
invariants (the kernels' contract): sequence ``s`` owns query rows
``query_start_loc[s]:query_start_loc[s+1]``, which sit at the last ``q_len`` positions of its
``seq_lens[s]`` tokens; ``block_table[s]`` addresses at least ``seq_lens[s]`` slots; a token's
``slot_mapping`` entry is ``block_id * block_size + offset`` of its position, or -1 to skip it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels import AttentionBackend


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Per-step inputs of every layer's attention (device tensors + host-side bounds)."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]: cache slot of each new token, -1 = skip
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]: block ids, padded with 0
    seq_lens: torch.Tensor  # int32 [num_seqs]: context length incl. this step's tokens
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: row offsets of each sequence's queries
    max_query_len: int  # host-side: longest query of the step (1 = decode-only batch)
    max_seq_len: int  # host-side: longest seq_len of the step

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


class PagedAttention:
    """Cache write + paged attention on one backend; one instance serves every layer."""

    def __init__(self, backend: AttentionBackend, scale: float) -> None:
        self.backend = backend
        self.scale = scale

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """``query [T, Hq, D]``, ``key/value [T, Hkv, D]`` → attention output ``[T, Hq, D]``."""
        kernels.reshape_and_cache(
            key, value, k_cache, v_cache, meta.slot_mapping, backend=self.backend
        )
        return kernels.paged_attention(
            query,
            k_cache,
            v_cache,
            meta.block_table,
            meta.seq_lens,
            meta.query_start_loc,
            scale=self.scale,
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            backend=self.backend,
        )
