"""The public paged-attention ops the worker calls: validate, pick a backend, dispatch.

Responsibility: one entry point per op with the same contract on every backend. Arguments are
validated once here (shapes, dtypes, strides, devices, host-side bounds; never tensor values on a
GPU, so no device sync), then either the torch reference or the Triton kernels run. On the Triton
path a decode-only batch goes to the decode kernel (split-KV when ``plan_attention`` says so) and
everything else to the unified kernel. The Triton modules are imported on first use, so importing
``kernels`` never imports Triton or fixes its interpreter mode.
"""

from __future__ import annotations

import torch

from kernels.backend import AttentionBackend, check_triton_device, parse_backend, select_backend
from kernels.reference import paged_attention_reference, reshape_and_cache_reference
from kernels.selection import AttentionKernel, AttentionPlan, device_num_sms, plan_attention
from kernels.validation import (
    AttentionDims,
    check_attention_values,
    check_cache_values,
    validate_attention_inputs,
    validate_cache_inputs,
)


def _resolve(backend: AttentionBackend | str | None, device: torch.device) -> AttentionBackend:
    if backend is None:
        return select_backend(device)
    resolved = parse_backend(backend)
    if resolved is AttentionBackend.TRITON:
        check_triton_device(device)
    return resolved


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: AttentionBackend | str | None = None,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into the caches in place.

    ``slot_mapping [num_tokens]`` (int64) holds ``block_id * block_size + offset`` per token; -1
    skips the token (padding). ``backend=None`` uses ``select_backend(key.device)``.
    """
    resolved = _resolve(backend, key.device)
    if resolved is AttentionBackend.REFERENCE:
        reshape_and_cache_reference(key, value, k_cache, v_cache, slot_mapping)
        return
    dims = validate_cache_inputs(key, value, k_cache, v_cache, slot_mapping)
    if key.device.type == "cpu":
        check_cache_values(dims, slot_mapping)
    from kernels.triton_cache import launch_reshape_and_cache  # lazy: fixes interpreter mode

    launch_reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, dims=dims)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    backend: AttentionBackend | str | None = None,
) -> torch.Tensor:
    """Causal varlen attention of ``query`` over a paged KV cache; returns ``out``.

    Shapes: ``query [num_tokens, num_q_heads, head_dim]`` (fp16/bf16/fp32); ``k_cache, v_cache
    [num_blocks, block_size, num_kv_heads, head_dim]`` (query's dtype); ``block_table [num_seqs,
    max_blocks_per_seq]``, ``seq_lens [num_seqs]`` (total context incl. this step's tokens),
    ``query_start_loc [num_seqs + 1]``: int32. Query token ``j`` of sequence ``s`` sits at
    position ``seq_lens[s] - q_len_s + j`` and attends to keys ``[0, position]``.
    ``max_query_len``/``max_seq_len`` are host-side upper bounds; ``max_query_len == 1`` declares
    a decode-only batch. The result has ``query``'s shape and dtype (fp32 accumulation); rows after
    ``query_start_loc[-1]`` are padding and not written by the kernels.
    """
    resolved = _resolve(backend, query.device)
    if resolved is AttentionBackend.REFERENCE:
        return paged_attention_reference(
            query, k_cache, v_cache, block_table, seq_lens, query_start_loc,
            scale=scale, max_query_len=max_query_len, max_seq_len=max_seq_len, out=out,
        )
    dims = validate_attention_inputs(
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc,
        scale=scale, max_query_len=max_query_len, max_seq_len=max_seq_len, out=out,
    )
    if query.device.type == "cpu":
        check_attention_values(dims, block_table, seq_lens, query_start_loc)
    result = torch.empty_like(query) if out is None else out
    plan = plan_for(dims, query.device)
    if plan.kernel is AttentionKernel.DECODE:
        from kernels.triton_decode import decode_attention  # lazy: fixes interpreter mode

        return decode_attention(
            query, k_cache, v_cache, block_table, seq_lens, query_start_loc, result,
            dims=dims, scale=float(scale), num_splits=plan.num_splits,
        )
    from kernels.triton_unified import unified_attention  # lazy: fixes interpreter mode

    return unified_attention(
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc, result,
        dims=dims, scale=float(scale),
    )


def plan_for(dims: AttentionDims, device: torch.device) -> AttentionPlan:
    """The Triton kernel plan ``paged_attention`` uses for a validated call on ``device``."""
    return plan_attention(
        num_seqs=dims.num_seqs, num_kv_heads=dims.num_kv_heads,
        max_query_len=dims.max_query_len, max_seq_len=dims.max_seq_len,
        num_sms=device_num_sms(device),
    )
