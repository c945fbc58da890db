"""Split-KV decode attention (flash-decoding) and its log-sum-exp merge.

Responsibility: attention for decode-only batches (each sequence has at most one query token).
Grid ``(num_seqs, num_kv_heads, num_splits)``: a program handles one sequence, one KV head with
all the query heads of its GQA group packed into ``BLOCK_H >= 16`` rows, and one contiguous
segment of the sequence's KV tiles (the tiles are divided evenly between the splits; a split past
the last tile is empty).

With one split the program writes the normalised output directly. With more, it writes its
normalised partial output ``o_i`` and log-sum-exp ``lse_i`` (base 2) to fp32 scratch, and
``_merge_splits_kernel`` combines them with weights ``w_i = 2**(lse_i - max_j lse_j)``:
``out = sum_i w_i * o_i / sum_i w_i``. An empty split has ``lse = -inf`` and weight 0. The split
count only changes how the sum is grouped, so split and unsplit outputs agree to rounding. The
per-tile math is ``attend_kv_tile``, shared with the unified kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.selection import TileConfig, decode_tile_config, dot_size, next_power_of_2
from kernels.triton_common import (
    LOG2_E,
    attend_kv_tile,
    check_kernel_device,
    dot_dtype,
    dot_precision,
)
from kernels.validation import AttentionDims


@triton.jit(do_not_specialize=["num_splits"])
def _decode_attention_kernel(
    out_ptr, partial_out_ptr, partial_lse_ptr,
    query_ptr, k_cache_ptr, v_cache_ptr,
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    qk_scale_log2, num_splits,
    stride_q_token, stride_q_head, stride_o_token, stride_o_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_bt_seq,
    NUM_Q_HEADS: tl.constexpr, Q_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    WRITE_PARTIAL: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_len == 0:
        return

    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE_SIZE)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_begin = split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, num_tiles)

    rows = tl.arange(0, BLOCK_H)
    q_head = kv_head * Q_PER_KV + rows
    row_mask = rows < Q_PER_KV
    dim = tl.arange(0, HEAD_DIM_PADDED)
    dim_mask = dim < HEAD_DIM
    io_mask = row_mask[:, None] & dim_mask[None, :]
    token = q_start.to(tl.int64)
    q = tl.load(
        query_ptr + token * stride_q_token + q_head[:, None] * stride_q_head + dim[None, :],
        mask=io_mask, other=0.0,
    ).to(DOT_DTYPE)
    query_pos = tl.full([BLOCK_H], 0, dtype=tl.int32) + seq_len - 1
    block_table_row_ptr = block_table_ptr + seq.to(tl.int64) * stride_bt_seq

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PADDED], dtype=tl.float32)
    for tile in range(tile_begin, tile_end):
        acc, m_i, l_i = attend_kv_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_row_ptr,
            tile * TILE_SIZE, seq_len, query_pos, kv_head,
            stride_k_block, stride_k_slot, stride_k_head,
            stride_v_block, stride_v_slot, stride_v_head,
            qk_scale_log2,
            BLOCK_SIZE, TILE_SIZE, HEAD_DIM, HEAD_DIM_PADDED, False, DOT_DTYPE, DOT_PRECISION,
        )
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if WRITE_PARTIAL:
        part = (seq.to(tl.int64) * NUM_Q_HEADS + q_head) * num_splits + split
        tl.store(
            partial_out_ptr + part[:, None] * HEAD_DIM_PADDED + dim[None, :], out,
            mask=row_mask[:, None],
        )
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        tl.store(partial_lse_ptr + part, lse, mask=row_mask)
    else:
        tl.store(
            out_ptr + token * stride_o_token + q_head[:, None] * stride_o_head + dim[None, :],
            out.to(out_ptr.dtype.element_ty), mask=io_mask,
        )


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(
    out_ptr, partial_out_ptr, partial_lse_ptr, query_start_loc_ptr,
    num_splits, stride_o_token, stride_o_head,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    SPLITS_PADDED: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_len == 0:
        return
    split = tl.arange(0, SPLITS_PADDED)
    split_mask = split < num_splits
    dim = tl.arange(0, HEAD_DIM_PADDED)
    part = (seq.to(tl.int64) * NUM_Q_HEADS + head) * num_splits + split
    lse = tl.load(partial_lse_ptr + part, mask=split_mask, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.exp2(lse - lse_max)
    partial = tl.load(
        partial_out_ptr + part[:, None] * HEAD_DIM_PADDED + dim[None, :],
        mask=split_mask[:, None], other=0.0,
    )
    total = tl.sum(weight, axis=0)
    out = tl.sum(partial * weight[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        out_ptr + q_start.to(tl.int64) * stride_o_token + head * stride_o_head + dim,
        out.to(out_ptr.dtype.element_ty), mask=dim < HEAD_DIM,
    )


def decode_meta(
    dims: AttentionDims, config: TileConfig, write_partial: bool, dot_type: tl.dtype
) -> dict[str, object]:
    """The compile-time arguments of the decode kernel for a call (also used by AOT checks)."""
    return {
        "NUM_Q_HEADS": dims.num_q_heads,
        "Q_PER_KV": dims.num_queries_per_kv,
        "HEAD_DIM": dims.head_dim,
        "HEAD_DIM_PADDED": dot_size(dims.head_dim),
        "BLOCK_SIZE": dims.block_size,
        "TILE_SIZE": config.tile_size,
        "BLOCK_H": config.block_m,
        "WRITE_PARTIAL": write_partial,
        "DOT_DTYPE": dot_type,
        "DOT_PRECISION": dot_precision(dot_type),
    }


def merge_meta(dims: AttentionDims, num_splits: int) -> dict[str, object]:
    """The compile-time arguments of the merge kernel (also used by AOT checks)."""
    return {
        "NUM_Q_HEADS": dims.num_q_heads,
        "HEAD_DIM": dims.head_dim,
        "HEAD_DIM_PADDED": dot_size(dims.head_dim),
        "SPLITS_PADDED": max(2, next_power_of_2(num_splits)),
    }


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    dims: AttentionDims,
    scale: float,
    num_splits: int,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """Launch decode (+ merge when ``num_splits > 1``) on validated inputs; writes ``out``.

    Requires a decode-only batch (``dims.max_query_len <= 1``). ``config`` overrides the tile
    shape; its ``block_m`` is the GQA-group tile and must be >= ``num_queries_per_kv``.
    """
    check_kernel_device(_decode_attention_kernel, query.device)
    if dims.max_query_len > 1:
        raise ValueError(
            f"decode attention needs a decode-only batch, got max_query_len={dims.max_query_len}"
        )
    if not 1 <= num_splits <= 1024:
        raise ValueError(f"num_splits must be between 1 and 1024, got {num_splits}")
    q_per_kv = dims.num_queries_per_kv
    if config is None:
        config = decode_tile_config(num_queries_per_kv=q_per_kv, head_dim=dims.head_dim)
    if config.block_m < q_per_kv:
        raise ValueError(
            f"config.block_m ({config.block_m}) must be >= num_queries_per_kv ({q_per_kv})"
        )
    if dims.num_tokens == 0 or dims.num_seqs == 0:
        return out
    head_dim_padded = dot_size(dims.head_dim)
    write_partial = num_splits > 1
    scratch_rows = dims.num_seqs * dims.num_q_heads * num_splits if write_partial else 1
    partial_out = torch.empty(
        (scratch_rows, head_dim_padded), dtype=torch.float32, device=query.device
    )
    partial_lse = torch.empty((scratch_rows,), dtype=torch.float32, device=query.device)
    meta = decode_meta(
        dims, config, write_partial, dot_dtype(_decode_attention_kernel, query.dtype)
    )
    _decode_attention_kernel[(dims.num_seqs, dims.num_kv_heads, num_splits)](
        out, partial_out, partial_lse, query, k_cache, v_cache,
        block_table, seq_lens, query_start_loc,
        scale * LOG2_E, num_splits,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        **meta, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if write_partial:
        _merge_splits_kernel[(dims.num_seqs, dims.num_q_heads)](
            out, partial_out, partial_lse, query_start_loc,
            num_splits, out.stride(0), out.stride(1),
            **merge_meta(dims, num_splits), num_warps=4,
        )
    return out
