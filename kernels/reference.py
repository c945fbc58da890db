"""Plain-torch paged attention: the oracle for the Triton kernels and the CPU worker's backend.

Responsibility: compute exactly what the kernels promise, in the most obvious way — gather each
sequence's K/V through its block table, upcast to fp32, softmax with a causal mask offset by the
cached context, cast back. One sequence at a time; it reads metadata on the host (a device sync),
which is fine for a reference and for the CPU worker.

Semantics shared with the kernels: query token ``j`` (0-based within its sequence's query) of
sequence ``s`` sits at absolute position ``seq_lens[s] - q_len_s + j`` and attends to keys
``[0, position]``. Rows of ``query`` after ``query_start_loc[-1]`` are padding: the reference
writes zeros there when it allocates the output and leaves a caller's ``out`` untouched; the
Triton kernels never write them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.validation import (
    check_attention_values,
    check_cache_values,
    validate_attention_inputs,
    validate_cache_inputs,
)


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Allowed elementwise error of a kernel against the reference (``torch.testing`` style)."""

    atol: float  # absolute part
    rtol: float  # relative part, times |reference|


#: KERNELS.md's tolerances per input dtype (fp32 accumulation everywhere).
_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=2e-3, rtol=2e-3),
    torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
}


def attention_tolerance(dtype: torch.dtype) -> Tolerance:
    """The tolerance a kernel output of ``dtype`` must meet against the reference."""
    if dtype not in _TOLERANCES:
        raise ValueError(f"no attention tolerance for dtype {dtype}")
    return _TOLERANCES[dtype]


def reshape_and_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key[i]``/``value[i]`` into slot ``slot_mapping[i]`` of the caches; -1 skips row i.

    A slot is ``block_id * block_size + offset``. Writes in place; returns nothing.
    """
    dims = validate_cache_inputs(key, value, k_cache, v_cache, slot_mapping)
    check_cache_values(dims, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks = torch.div(slots, dims.block_size, rounding_mode="floor")
    offsets = slots % dims.block_size
    k_cache[blocks, offsets] = key[keep]
    v_cache[blocks, offsets] = value[keep]


def paged_attention_reference(
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
) -> torch.Tensor:
    """Causal varlen attention over a paged KV cache, in fp32, returned in ``query``'s dtype.

    Shapes: ``query [num_tokens, num_q_heads, head_dim]``; ``k_cache, v_cache [num_blocks,
    block_size, num_kv_heads, head_dim]``; ``block_table [num_seqs, max_blocks_per_seq]``;
    ``seq_lens [num_seqs]`` (context including this step's tokens); ``query_start_loc
    [num_seqs + 1]``. Only the blocks covering ``seq_lens[s]`` tokens are read, so unused slots may
    hold anything (even NaN).
    """
    dims = validate_attention_inputs(
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc,
        scale=scale, max_query_len=max_query_len, max_seq_len=max_seq_len, out=out,
    )
    check_attention_values(dims, block_table, seq_lens, query_start_loc)
    result = torch.zeros_like(query) if out is None else out
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for seq in range(dims.num_seqs):
        begin, end = starts[seq], starts[seq + 1]
        if end > begin:
            result[begin:end] = _attend_one_sequence(
                query[begin:end], k_cache, v_cache, block_table[seq], lens[seq],
                scale=float(scale), num_queries_per_kv=dims.num_queries_per_kv,
            ).to(query.dtype)
    return result


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """The first ``seq_len`` cached rows of one sequence, ``[seq_len, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    num_used = -(-seq_len // block_size)
    blocks = block_table_row[:num_used].long()
    return cache[blocks].reshape(num_used * block_size, *cache.shape[2:])[:seq_len]


def _attend_one_sequence(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table_row: torch.Tensor,
    seq_len: int,
    *,
    scale: float,
    num_queries_per_kv: int,
) -> torch.Tensor:
    """fp32 attention of one sequence's ``q_len`` query rows over its ``seq_len`` keys."""
    q_len = query.shape[0]
    keys = gather_kv(k_cache, block_table_row, seq_len).float()
    values = gather_kv(v_cache, block_table_row, seq_len).float()
    keys = keys.repeat_interleave(num_queries_per_kv, dim=1)  # [seq_len, num_q_heads, head_dim]
    values = values.repeat_interleave(num_queries_per_kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale
    positions = torch.arange(seq_len - q_len, seq_len, device=query.device)
    key_pos = torch.arange(seq_len, device=query.device)
    visible = key_pos[None, :] <= positions[:, None]  # [q_len, seq_len]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values)
