"""Triton building blocks shared by the attention kernels, and launch-time helpers.

Responsibility: the one online-softmax step over a KV tile read through the block table (used by
both the unified and the decode kernel, so they agree bit for bit on the math), the sequence
lookup of the unified grid, and the host-side choices every launcher makes (dot dtype, whether the
kernels are interpreted).

Importing this module imports Triton and decorates kernels; Triton decides *then* whether they are
interpreted (``TRITON_INTERPRET=1``) or compiled. ``kernels`` therefore imports the Triton modules
lazily, at the first launch.

Interpreter rules followed by every kernel (KERNELS.md): all loads are masked and masked lanes
load 0, so a NaN in an unused cache slot can never reach a softmax lane; scores of invisible keys
are set to -inf *after* the dot and a row with no visible key yet keeps its running max at -inf
without producing NaN; bf16 values are upcast right after loading whenever the dot dtype is fp32
(the interpreter's bf16 arithmetic is wrong; its fp32 -> bf16 store truncates instead of rounding,
an error within the bf16 tolerance); no autotune, inline asm or block pointers.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

#: log2(e): the kernels work in base 2 (``exp2``), so the softmax scale is pre-multiplied by it.
LOG2_E = math.log2(math.e)

_TRITON_DTYPES = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
}


def is_interpreted(kernel: object) -> bool:
    """True when ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (runs on the CPU)."""
    return isinstance(kernel, InterpretedFunction)


def check_kernel_device(kernel: object, device: torch.device) -> None:
    """Raise ``ValueError`` when ``kernel`` cannot run on tensors of ``device``."""
    if device.type == "cpu" and not is_interpreted(kernel):
        raise ValueError(
            "the Triton kernels were compiled for a GPU (kernels' Triton modules were imported "
            "without TRITON_INTERPRET=1), so they cannot run on CPU tensors; set "
            "TRITON_INTERPRET=1 before the first launch or use the 'reference' backend"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the Triton kernels cannot run on {device.type} tensors")


def dot_dtype(kernel: object, dtype: torch.dtype) -> tl.dtype:
    """Operand dtype of ``tl.dot``: the input dtype on a GPU, fp32 in the interpreter."""
    return tl.float32 if is_interpreted(kernel) else _TRITON_DTYPES[dtype]


def dot_precision(dot_type: tl.dtype) -> str:
    """``tl.dot`` input precision: exact ("ieee") for fp32 operands, so fp32 meets 1e-5."""
    return "ieee" if dot_type == tl.float32 else "tf32"


@triton.jit
def find_seq_index(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence owning global query block ``q_block_global`` of the unified grid.

    Sequence ``s`` owns global blocks from ``query_start_loc[s] // BLOCK_Q + s`` on; these starts
    strictly increase, so a binary search finds the last start <= ``q_block_global``.
    """
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if start <= q_block_global:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def attend_kv_tile(
    q, acc, m_i, l_i,
    k_cache_ptr, v_cache_ptr, block_table_row_ptr,
    tile_start, kv_end, query_pos, kv_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    qk_scale_log2,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One online-softmax step over KV positions ``[tile_start, tile_start + TILE_SIZE)``.

    ``q`` is ``[ROWS, HEAD_DIM_PADDED]`` in ``DOT_DTYPE``; ``acc`` (unnormalised output), ``m_i``
    (running max, base 2) and ``l_i`` (running sum) are fp32. Positions ``>= kv_end`` are never
    loaded; with ``CAUSAL`` a row also ignores positions after its ``query_pos``. Returns the
    updated ``(acc, m_i, l_i)``.
    """
    pos = tile_start + tl.arange(0, TILE_SIZE)
    pos_mask = pos < kv_end
    block_ids = tl.load(block_table_row_ptr + pos // BLOCK_SIZE, mask=pos_mask, other=0)
    block_ids = block_ids.to(tl.int64)
    slots = (pos % BLOCK_SIZE).to(tl.int64)
    dim = tl.arange(0, HEAD_DIM_PADDED)
    dim_mask = dim < HEAD_DIM
    k_ptrs = (k_cache_ptr + block_ids[None, :] * stride_k_block + slots[None, :] * stride_k_slot
              + kv_head * stride_k_head + dim[:, None])
    k = tl.load(k_ptrs, mask=dim_mask[:, None] & pos_mask[None, :], other=0.0)
    scores = tl.dot(q, k.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale_log2
    if CAUSAL:
        visible = pos_mask[None, :] & (pos[None, :] <= query_pos[:, None])
    else:
        visible = pos_mask[None, :]
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v_ptrs = (v_cache_ptr + block_ids[:, None] * stride_v_block + slots[:, None] * stride_v_slot
              + kv_head * stride_v_head + dim[None, :])
    v = tl.load(v_ptrs, mask=pos_mask[:, None] & dim_mask[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION
    )
    return acc, m_new, l_i
