"""Random paged-attention batches for tests and benchmarks, poisoned where nothing may be read.

Responsibility: build the exact tensors the worker would hand to ``paged_attention`` for a given
batch composition — a shuffled block assignment (so the block-table indirection matters), K/V
written only for the first ``seq_len`` positions of each sequence, and NaN everywhere a correct
kernel must not read: the unused tail slots of each last block, a dedicated poison block that
fills every unused block-table entry, and trailing padding query rows. Seeded: the same spec gives
the same tensors on the same device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.selection import cdiv


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """What to build. Invariant: one ``query_lens`` and one ``context_lens`` entry per sequence."""

    query_lens: tuple[int, ...]  # new tokens of each sequence in this step (1 = decode)
    context_lens: tuple[int, ...]  # tokens each sequence already has in the cache
    num_q_heads: int  # query heads
    num_kv_heads: int  # key/value heads (divides num_q_heads)
    head_dim: int  # elements per head
    block_size: int  # token slots per cache block
    dtype: torch.dtype = torch.float32  # query and cache element type
    num_padding_tokens: int = 0  # query rows after the last sequence (CUDA-graph padding)
    extra_blocks_per_seq: int = 1  # block-table columns beyond the longest sequence's need
    seed: int = 0  # seeds every random draw
    poison: bool = True  # NaN in unused slots, unused table entries and padding rows

    def __post_init__(self) -> None:
        if len(self.query_lens) != len(self.context_lens):
            raise ValueError(
                f"query_lens ({len(self.query_lens)}) and context_lens "
                f"({len(self.context_lens)}) must have one entry per sequence"
            )
        if any(q < 0 for q in self.query_lens) or any(c < 0 for c in self.context_lens):
            raise ValueError("query_lens and context_lens must be non-negative")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError("num_kv_heads must divide num_q_heads")

    @property
    def seq_lens(self) -> tuple[int, ...]:
        """Total context of each sequence, this step's tokens included."""
        return tuple(q + c for q, c in zip(self.query_lens, self.context_lens, strict=True))


@dataclass(frozen=True, slots=True)
class PagedBatch:
    """The arguments of one ``paged_attention`` call (see ``kernels.attention``)."""

    query: torch.Tensor  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor  # same shape as k_cache
    block_table: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    max_query_len: int  # host-side max of the query lengths
    max_seq_len: int  # host-side max of seq_lens
    scale: float  # softmax scale, 1 / sqrt(head_dim)

    def attention_args(self) -> tuple[torch.Tensor, ...]:
        """The positional tensors of ``paged_attention``, in order."""
        return (self.query, self.k_cache, self.v_cache, self.block_table, self.seq_lens,
                self.query_start_loc)

    def attention_kwargs(self) -> dict[str, float | int]:
        """The keyword arguments of ``paged_attention`` (scale and host-side bounds)."""
        return {"scale": self.scale, "max_query_len": self.max_query_len,
                "max_seq_len": self.max_seq_len}


def make_paged_batch(spec: BatchSpec, device: torch.device | str = "cpu") -> PagedBatch:
    """Build a seeded random batch for ``spec`` on ``device``."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(spec.seed)
    seq_lens = spec.seq_lens
    used = [cdiv(n, spec.block_size) for n in seq_lens]
    num_blocks = sum(used) + 1  # + the poison block
    order = torch.randperm(num_blocks, generator=gen, device=dev).tolist()
    poison_block = order[-1]
    width = max(1, max([*used, 0]) + spec.extra_blocks_per_seq)
    table = [[poison_block] * width for _ in seq_lens]
    taken = 0
    for row, n in zip(table, used, strict=True):
        row[:n] = order[taken : taken + n]
        taken += n
    block_table = torch.tensor(table, dtype=torch.int32, device=dev).reshape(len(table), width)
    fill = float("nan") if spec.poison else 0.0
    shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    k_cache = torch.full(shape, fill, dtype=spec.dtype, device=dev)
    v_cache = torch.full(shape, fill, dtype=spec.dtype, device=dev)
    slots = _slots_of(block_table, seq_lens, spec.block_size)
    rows = (slots.numel(), spec.num_kv_heads, spec.head_dim)
    k_cache.view(-1, *rows[1:])[slots] = _randn(rows, gen, spec.dtype, dev)
    v_cache.view(-1, *rows[1:])[slots] = _randn(rows, gen, spec.dtype, dev)
    num_tokens = sum(spec.query_lens)
    query = _randn((num_tokens, spec.num_q_heads, spec.head_dim), gen, spec.dtype, dev)
    padding = torch.full(
        (spec.num_padding_tokens, spec.num_q_heads, spec.head_dim), fill, dtype=spec.dtype,
        device=dev,
    )
    starts = [0]
    for q in spec.query_lens:
        starts.append(starts[-1] + q)
    return PagedBatch(
        query=torch.cat([query, padding]),
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=block_table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        max_query_len=max([*spec.query_lens, 0]),
        max_seq_len=max([*seq_lens, 0]),
        scale=1.0 / math.sqrt(spec.head_dim),
    )


def _slots_of(
    block_table: torch.Tensor, seq_lens: tuple[int, ...], block_size: int
) -> torch.Tensor:
    """Flat cache slots of positions ``[0, seq_len)`` of every sequence, in order."""
    parts = []
    for seq, n in enumerate(seq_lens):
        pos = torch.arange(n, device=block_table.device)
        blocks = block_table[seq].long()[pos // block_size]
        parts.append(blocks * block_size + pos % block_size)
    if not parts:
        return torch.empty(0, dtype=torch.long, device=block_table.device)
    return torch.cat(parts)


def _randn(
    shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
