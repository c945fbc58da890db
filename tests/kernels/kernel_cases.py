"""Hypothesis strategies and assertions shared by the kernel tests.

Shapes stay tiny: the Triton interpreter costs a few milliseconds per program and KV-loop
iteration, so batches have at most a few sequences, 1-2 KV heads and contexts of a few dozen tokens
— still enough to cross block and tile boundaries, since both are drawn small too.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernels.paged_batch import BatchSpec, PagedBatch
from kernels.reference import attention_tolerance
from kernels.selection import TileConfig, next_power_of_2

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_SIZES = (1, 4, 5, 8, 16, 32)
HEAD_DIMS = (8, 16, 32, 40, 64)
QUERIES_PER_KV = (1, 2, 3, 4, 8, 32)


@st.composite
def lengths_near_blocks(draw: st.DrawFn, block_size: int, max_blocks: int) -> int:
    """A length at, just before or just after a multiple of ``block_size`` (or anywhere)."""
    if draw(st.booleans()):
        return draw(st.integers(0, block_size * max_blocks))
    edge = block_size * draw(st.integers(0, max_blocks))
    return max(0, edge + draw(st.sampled_from((-1, 0, 1))))


@st.composite
def batch_specs(
    draw: st.DrawFn,
    *,
    decode_only: bool = False,
    max_seqs: int = 3,
    max_query_len: int = 24,
    max_context_len: int = 48,
) -> BatchSpec:
    """A random batch: mixed (prefill chunks, decodes, idle sequences) or decode-only."""
    num_seqs = draw(st.integers(1, max_seqs))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    max_blocks = max(1, max_context_len // block_size)
    context_lens = [
        min(max_context_len, draw(lengths_near_blocks(block_size, max_blocks)))
        for _ in range(num_seqs)
    ]
    if decode_only:
        query_lens = [draw(st.sampled_from((1, 1, 1, 0))) for _ in range(num_seqs)]
    else:
        query_lens = [
            draw(st.one_of(st.just(1), st.integers(0, max_query_len))) for _ in range(num_seqs)
        ]
    if sum(query_lens) == 0:
        query_lens[0] = 1
    num_kv_heads = draw(st.sampled_from((1, 2)))
    return BatchSpec(
        query_lens=tuple(query_lens),
        context_lens=tuple(context_lens),
        num_q_heads=num_kv_heads * draw(st.sampled_from(QUERIES_PER_KV)),
        num_kv_heads=num_kv_heads,
        head_dim=draw(st.sampled_from(HEAD_DIMS)),
        block_size=block_size,
        dtype=draw(st.sampled_from(DTYPES)),
        num_padding_tokens=draw(st.integers(0, 2)),
        extra_blocks_per_seq=draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def tile_configs(draw: st.DrawFn, num_queries_per_kv: int, *, max_block_m: int = 64) -> TileConfig:
    """A tile shape valid for a GQA group of ``num_queries_per_kv`` heads."""
    smallest = max(16, next_power_of_2(num_queries_per_kv))
    choices = [m for m in (16, 32, 64) if smallest <= m <= max(max_block_m, smallest)]
    return TileConfig(
        block_m=draw(st.sampled_from(choices or [smallest])),
        tile_size=draw(st.sampled_from((16, 32))),
        num_warps=4,
        num_stages=2,
    )


def real_rows(batch: PagedBatch) -> int:
    """Number of query rows that belong to a sequence (the rest are padding)."""
    return int(batch.query_start_loc[-1])


def assert_close_to(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Elementwise ``|a - e| <= atol + rtol * |e|`` with KERNELS.md's tolerance for ``dtype``."""
    tol = attention_tolerance(dtype)
    assert torch.isfinite(actual).all(), "kernel output holds NaN/inf (a poisoned slot leaked?)"
    torch.testing.assert_close(
        actual.float(), expected.float(), atol=tol.atol, rtol=tol.rtol, equal_nan=False
    )
