"""Unified varlen paged attention: one launch for a mixed batch of prefill chunks and decodes.

Responsibility: causal attention of every query token of a flattened varlen batch over its
sequence's paged KV cache. Each program owns one KV head and one *query block* of ``BLOCK_Q``
consecutive tokens of one sequence; its ``BLOCK_M = BLOCK_Q * num_queries_per_kv`` tile rows pack
those tokens with the GQA query heads that share the KV head (row ``r`` = token ``r //
num_queries_per_kv``, head ``r % num_queries_per_kv``), so every K/V tile read from memory serves
the whole group and ``tl.dot`` always sees >= 16 rows.

Grid ``(num_tokens // BLOCK_Q + num_seqs, num_kv_heads)``: an upper bound on the query blocks of
any batch with that many tokens and sequences (sequence ``s`` owns global blocks from
``query_start_loc[s] // BLOCK_Q + s``), so the launch shape is CUDA-graph friendly; surplus
programs exit at once. A query row at absolute position ``p = seq_len - q_len + j`` sees keys
``[0, p]``; the program stops reading K/V after the last position its rows can see.

A sliding window would only add a lower bound to the KV loop and one more mask term.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.selection import TileConfig, cdiv, dot_size, unified_tile_config
from kernels.triton_common import (
    LOG2_E,
    attend_kv_tile,
    check_kernel_device,
    dot_dtype,
    dot_precision,
    find_seq_index,
)
from kernels.validation import AttentionDims


@triton.jit(do_not_specialize=["num_seqs"])
def _unified_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr,
    block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    qk_scale_log2, num_seqs,
    stride_q_token, stride_q_head, stride_o_token, stride_o_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_bt_seq,
    Q_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    q_block_global = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = find_seq_index(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return

    rows = tl.arange(0, BLOCK_M)
    q_index = q_block * BLOCK_Q + rows // Q_PER_KV  # token within this sequence's query
    q_head = kv_head * Q_PER_KV + rows % Q_PER_KV
    row_mask = (rows < BLOCK_Q * Q_PER_KV) & (q_index < q_len)
    dim = tl.arange(0, HEAD_DIM_PADDED)
    dim_mask = dim < HEAD_DIM
    token = (q_start + q_index).to(tl.int64)
    io_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(
        query_ptr + token[:, None] * stride_q_token + q_head[:, None] * stride_q_head
        + dim[None, :],
        mask=io_mask, other=0.0,
    ).to(DOT_DTYPE)

    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    query_pos = context_len + q_index
    kv_end = context_len + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len)
    block_table_row_ptr = block_table_ptr + seq.to(tl.int64) * stride_bt_seq

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    for tile_start in range(0, kv_end, TILE_SIZE):
        acc, m_i, l_i = attend_kv_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_row_ptr,
            tile_start, kv_end, query_pos, kv_head,
            stride_k_block, stride_k_slot, stride_k_head,
            stride_v_block, stride_v_slot, stride_v_head,
            qk_scale_log2,
            BLOCK_SIZE, TILE_SIZE, HEAD_DIM, HEAD_DIM_PADDED, True, DOT_DTYPE, DOT_PRECISION,
        )
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + token[:, None] * stride_o_token + q_head[:, None] * stride_o_head
        + dim[None, :],
        out.to(out_ptr.dtype.element_ty), mask=io_mask,
    )


def unified_meta(dims: AttentionDims, config: TileConfig, dot_type: tl.dtype) -> dict[str, object]:
    """The compile-time arguments of the unified kernel for a call (also used by AOT checks)."""
    return {
        "Q_PER_KV": dims.num_queries_per_kv,
        "HEAD_DIM": dims.head_dim,
        "HEAD_DIM_PADDED": dot_size(dims.head_dim),
        "BLOCK_SIZE": dims.block_size,
        "TILE_SIZE": config.tile_size,
        "BLOCK_M": config.block_m,
        "BLOCK_Q": config.block_m // dims.num_queries_per_kv,
        "DOT_DTYPE": dot_type,
        "DOT_PRECISION": dot_precision(dot_type),
    }


def unified_attention(
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
    config: TileConfig | None = None,
) -> torch.Tensor:
    """Launch the unified kernel on already-validated inputs; writes and returns ``out``.

    ``config`` overrides the tile shape (tests use it to cross tile boundaries cheaply); its
    ``block_m`` must hold a whole GQA group.
    """
    check_kernel_device(_unified_attention_kernel, query.device)
    q_per_kv = dims.num_queries_per_kv
    if config is None:
        config = unified_tile_config(
            num_queries_per_kv=q_per_kv, max_query_len=dims.max_query_len,
            mean_query_len=cdiv(dims.num_tokens, max(dims.num_seqs, 1)), head_dim=dims.head_dim,
        )
    if config.block_m < q_per_kv:
        raise ValueError(
            f"config.block_m ({config.block_m}) must be >= num_queries_per_kv ({q_per_kv})"
        )
    if dims.num_tokens == 0 or dims.num_seqs == 0:
        return out
    block_q = config.block_m // q_per_kv
    grid = (dims.num_tokens // block_q + dims.num_seqs, dims.num_kv_heads)
    meta = unified_meta(dims, config, dot_dtype(_unified_attention_kernel, query.dtype))
    _unified_attention_kernel[grid](
        out, query, k_cache, v_cache, block_table, seq_lens, query_start_loc,
        scale * LOG2_E, dims.num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        **meta, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
