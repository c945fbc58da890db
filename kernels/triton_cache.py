"""``reshape_and_cache``: scatter this step's new K/V rows into their paged-cache slots.

Responsibility: for each token ``i`` with ``slot_mapping[i] >= 0`` copy ``key[i]`` and
``value[i]`` (all KV heads) to block ``slot // block_size``, offset ``slot % block_size``, of the
caches; a negative slot (-1: padding) is skipped. One program per token copies a
``[num_kv_heads, head_dim]`` tile; the copy is exact (no dtype conversion), so it is also exact in
the interpreter for bf16. Key/value may be strided views (e.g. slices of a fused QKV output) as
long as the head dimension is contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.selection import next_power_of_2
from kernels.triton_common import check_kernel_device
from kernels.validation import CacheDims


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_key_token, stride_key_head, stride_value_token, stride_value_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEADS_PADDED: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    head = tl.arange(0, HEADS_PADDED)[:, None]
    dim = tl.arange(0, HEAD_DIM_PADDED)[None, :]
    mask = (head < NUM_KV_HEADS) & (dim < HEAD_DIM)
    key = tl.load(key_ptr + token * stride_key_token + head * stride_key_head + dim, mask=mask)
    tl.store(
        k_cache_ptr + block * stride_k_block + offset * stride_k_slot + head * stride_k_head + dim,
        key, mask=mask,
    )
    value = tl.load(
        value_ptr + token * stride_value_token + head * stride_value_head + dim, mask=mask
    )
    tl.store(
        v_cache_ptr + block * stride_v_block + offset * stride_v_slot + head * stride_v_head + dim,
        value, mask=mask,
    )


def cache_meta(dims: CacheDims) -> dict[str, object]:
    """The compile-time arguments of the copy kernel (also used by AOT checks)."""
    return {
        "NUM_KV_HEADS": dims.num_kv_heads,
        "HEAD_DIM": dims.head_dim,
        "BLOCK_SIZE": dims.block_size,
        "HEADS_PADDED": next_power_of_2(dims.num_kv_heads),
        "HEAD_DIM_PADDED": next_power_of_2(dims.head_dim),
    }


def launch_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    dims: CacheDims,
) -> None:
    """Launch the copy on already-validated inputs (``validate_cache_inputs``)."""
    check_kernel_device(_reshape_and_cache_kernel, key.device)
    if dims.num_tokens == 0:
        return
    _reshape_and_cache_kernel[(dims.num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        **cache_meta(dims), num_warps=4,
    )
