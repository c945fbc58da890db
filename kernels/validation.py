"""Argument checks shared by every paged-attention implementation.

Responsibility: turn the tensors a caller hands to ``paged_attention`` / ``reshape_and_cache`` into
small frozen dimension records, or raise a ``ValueError`` that names the offending argument. The
Triton launchers and the torch reference run the same checks, so both backends accept exactly the
same inputs.

Two tiers:

* ``validate_*`` look only at shapes, dtypes, strides, devices and host-side ints. They never read
  tensor *values*, so they never synchronise with a GPU and are cheap enough for every call.
* ``check_*_values`` read the metadata tensors (``query_start_loc``, ``seq_lens``, the block
  table, ``slot_mapping``). The reference always runs them; the Triton launchers run them only on
  CPU tensors (the interpreter), where a bad index would otherwise crash the process and reading
  is free. On a GPU the caller (the model runner) owns these invariants.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

#: Element types the attention kernels accept for queries and caches (accumulation is fp32).
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
#: Largest head dimension the kernels accept (it is padded to a power of two in registers).
MAX_HEAD_DIM = 256
#: Integer type of the block table, ``seq_lens`` and ``query_start_loc``.
METADATA_DTYPE = torch.int32
#: Integer type of ``slot_mapping`` (a slot index can exceed 2**31 for large caches).
SLOT_DTYPE = torch.int64


@dataclass(frozen=True, slots=True)
class AttentionDims:
    """Sizes of one validated ``paged_attention`` call.

    Invariants: ``num_q_heads % num_kv_heads == 0``; ``1 <= head_dim <= MAX_HEAD_DIM``;
    ``max_query_len <= num_tokens``; ``max_query_len <= max_seq_len <= block_size *
    max_blocks_per_seq`` whenever ``num_tokens > 0``.
    """

    num_tokens: int  # rows of the flattened varlen query (may include trailing padding)
    num_seqs: int  # sequences in the batch
    num_q_heads: int  # query heads
    num_kv_heads: int  # key/value heads
    head_dim: int  # elements per head
    num_blocks: int  # blocks in the cache
    block_size: int  # token slots per block
    max_blocks_per_seq: int  # columns of the block table
    max_query_len: int  # host-side upper bound of any sequence's query length
    max_seq_len: int  # host-side upper bound of any sequence's total length

    @property
    def num_queries_per_kv(self) -> int:
        """GQA group size: query heads that share one KV head."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def is_decode_only(self) -> bool:
        """True when every sequence has at most one query token (the caller's promise)."""
        return self.max_query_len == 1


@dataclass(frozen=True, slots=True)
class CacheDims:
    """Sizes of one validated ``reshape_and_cache`` call."""

    num_tokens: int  # rows of key/value (and entries of slot_mapping)
    num_kv_heads: int  # key/value heads
    head_dim: int  # elements per head
    num_blocks: int  # blocks in the cache
    block_size: int  # token slots per block


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _check_tensor(name: str, t: object, ndim: int) -> torch.Tensor:
    _require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(t, torch.Tensor)
    _require(t.dim() == ndim, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


def _check_float(name: str, t: torch.Tensor) -> None:
    _require(
        t.dtype in SUPPORTED_DTYPES,
        f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)}",
    )


def _check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    _require(
        t.shape[-1] <= 1 or t.stride(-1) == 1,
        f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}",
    )


def _check_metadata(name: str, t: object, ndim: int, dtype: torch.dtype) -> torch.Tensor:
    t = _check_tensor(name, t, ndim)
    _require(t.dtype == dtype, f"{name} must have dtype {dtype}, got {t.dtype}")
    _check_last_dim_contiguous(name, t)
    return t


def _check_device(device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _require(
            t.device == device,
            f"{name} is on {t.device} but the query/key is on {device}; all tensors must share a "
            "device",
        )


def _check_host_int(name: str, value: object, minimum: int) -> int:
    _require(
        isinstance(value, numbers.Integral) and not isinstance(value, bool),
        f"{name} must be a host-side Python int (no device tensor), got {type(value).__name__}",
    )
    number = int(value)  # type: ignore[call-overload]
    _require(number >= minimum, f"{name} must be >= {minimum}, got {number}")
    return number


def _check_cache_pair(k_cache: object, v_cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    k = _check_tensor("k_cache", k_cache, 4)
    v = _check_tensor("v_cache", v_cache, 4)
    _require(
        k.shape == v.shape,
        f"k_cache and v_cache must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}",
    )
    _require(k.dtype == v.dtype, f"k_cache ({k.dtype}) and v_cache ({v.dtype}) differ in dtype")
    _check_float("k_cache", k)
    _check_last_dim_contiguous("k_cache", k)
    _check_last_dim_contiguous("v_cache", v)
    _require(v.device == k.device, f"v_cache is on {v.device} but k_cache is on {k.device}")
    _require(k.shape[1] >= 1, f"k_cache block_size (dim 1) must be >= 1, got {k.shape[1]}")
    _require(k.shape[2] >= 1, f"k_cache num_kv_heads (dim 2) must be >= 1, got {k.shape[2]}")
    head_dim = k.shape[3]
    _require(
        1 <= head_dim <= MAX_HEAD_DIM,
        f"head_dim {head_dim} is not supported; it must be between 1 and {MAX_HEAD_DIM}",
    )
    return k, v


def validate_attention_inputs(
    query: object,
    k_cache: object,
    v_cache: object,
    block_table: object,
    seq_lens: object,
    query_start_loc: object,
    *,
    scale: object,
    max_query_len: object,
    max_seq_len: object,
    out: object = None,
) -> AttentionDims:
    """Check every ``paged_attention`` argument without reading tensor values.

    Returns the call's dimensions. Raises ``ValueError`` naming the first bad argument.
    """
    q = _check_tensor("query", query, 3)
    _check_float("query", q)
    _check_last_dim_contiguous("query", q)
    k, v = _check_cache_pair(k_cache, v_cache)
    num_tokens, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, kv_head_dim = k.shape
    _require(
        k.dtype == q.dtype, f"k_cache dtype {k.dtype} must match query dtype {q.dtype}"
    )
    _require(
        head_dim == kv_head_dim,
        f"query head_dim {head_dim} does not match the cache head_dim {kv_head_dim}",
    )
    _require(num_q_heads >= 1, "query must have at least one head")
    _require(
        num_q_heads % num_kv_heads == 0,
        f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})",
    )
    bt = _check_metadata("block_table", block_table, 2, METADATA_DTYPE)
    sl = _check_metadata("seq_lens", seq_lens, 1, METADATA_DTYPE)
    qsl = _check_metadata("query_start_loc", query_start_loc, 1, METADATA_DTYPE)
    num_seqs = sl.shape[0]
    _require(
        bt.shape[0] == num_seqs,
        f"block_table has {bt.shape[0]} rows but seq_lens has {num_seqs} entries",
    )
    _require(
        qsl.shape[0] == num_seqs + 1,
        f"query_start_loc must have num_seqs + 1 = {num_seqs + 1} entries, got {qsl.shape[0]}",
    )
    _check_device(q.device, k_cache=k, v_cache=v, block_table=bt, seq_lens=sl,
                  query_start_loc=qsl)
    _require(
        isinstance(scale, numbers.Real) and not isinstance(scale, bool),
        f"scale must be a Python float, got {type(scale).__name__}",
    )
    _require(
        0.0 < float(scale) < float("inf"),  # type: ignore[arg-type]
        f"scale must be finite and > 0, got {scale}",
    )
    dims = AttentionDims(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_blocks=num_blocks,
        block_size=block_size,
        max_blocks_per_seq=bt.shape[1],
        max_query_len=_check_host_int("max_query_len", max_query_len, 0),
        max_seq_len=_check_host_int("max_seq_len", max_seq_len, 0),
    )
    _check_bounds(dims)
    if out is not None:
        _check_out(out, q)
    return dims


def _check_bounds(dims: AttentionDims) -> None:
    if dims.num_tokens == 0:
        return
    _require(dims.num_seqs >= 1, f"query has {dims.num_tokens} tokens but there are no sequences")
    _require(
        1 <= dims.max_query_len <= dims.num_tokens,
        f"max_query_len must be between 1 and num_tokens ({dims.num_tokens}), "
        f"got {dims.max_query_len}",
    )
    _require(
        dims.max_seq_len >= dims.max_query_len,
        f"max_seq_len ({dims.max_seq_len}) must be >= max_query_len ({dims.max_query_len})",
    )
    capacity = dims.block_size * dims.max_blocks_per_seq
    _require(
        dims.max_seq_len <= capacity,
        f"max_seq_len ({dims.max_seq_len}) exceeds what block_table can address "
        f"({dims.max_blocks_per_seq} blocks x {dims.block_size} slots = {capacity})",
    )


def _check_out(out: object, q: torch.Tensor) -> None:
    o = _check_tensor("out", out, 3)
    _require(
        o.shape == q.shape, f"out shape {tuple(o.shape)} must equal query shape {tuple(q.shape)}"
    )
    _require(o.dtype == q.dtype, f"out dtype {o.dtype} must equal query dtype {q.dtype}")
    _require(o.device == q.device, f"out is on {o.device} but query is on {q.device}")
    _check_last_dim_contiguous("out", o)


def validate_cache_inputs(
    key: object, value: object, k_cache: object, v_cache: object, slot_mapping: object
) -> CacheDims:
    """Check every ``reshape_and_cache`` argument without reading tensor values."""
    k = _check_tensor("key", key, 3)
    v = _check_tensor("value", value, 3)
    _require(
        k.shape == v.shape,
        f"key and value must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}",
    )
    kc, vc = _check_cache_pair(k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = k.shape
    num_blocks, block_size, cache_heads, cache_head_dim = kc.shape
    _require(
        (num_kv_heads, head_dim) == (cache_heads, cache_head_dim),
        f"key has {num_kv_heads} heads x {head_dim} dims but the cache holds "
        f"{cache_heads} heads x {cache_head_dim} dims",
    )
    for name, t in (("key", k), ("value", v)):
        _require(t.dtype == kc.dtype, f"{name} dtype {t.dtype} must match cache dtype {kc.dtype}")
        _check_last_dim_contiguous(name, t)
    sm = _check_metadata("slot_mapping", slot_mapping, 1, SLOT_DTYPE)
    _require(
        sm.shape[0] == num_tokens,
        f"slot_mapping has {sm.shape[0]} entries but key has {num_tokens} tokens",
    )
    _check_device(k.device, value=v, k_cache=kc, v_cache=vc, slot_mapping=sm)
    return CacheDims(num_tokens, num_kv_heads, head_dim, num_blocks, block_size)


def check_attention_values(
    dims: AttentionDims,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    """Check the metadata *values* (reads them: a device sync on a GPU).

    Invariants enforced: ``query_start_loc`` starts at 0, never decreases and ends at or before
    ``num_tokens`` (rows after it are padding); each query fits its sequence (``q_len <=
    seq_len``); the host-side bounds hold; every block a sequence uses is a valid cache block.
    """
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    if dims.num_seqs == 0:
        return
    _require(qsl[0] == 0, f"query_start_loc must start at 0, got {qsl[0]}")
    _require(
        qsl[-1] <= dims.num_tokens,
        f"query_start_loc ends at {qsl[-1]}, beyond the {dims.num_tokens} query tokens",
    )
    for seq in range(dims.num_seqs):
        q_len = qsl[seq + 1] - qsl[seq]
        _require(q_len >= 0, f"query_start_loc decreases at sequence {seq}")
        _require(
            q_len <= lens[seq],
            f"sequence {seq}: query length {q_len} exceeds seq_lens[{seq}] = {lens[seq]}",
        )
        _require(
            q_len <= dims.max_query_len,
            f"sequence {seq}: query length {q_len} exceeds max_query_len {dims.max_query_len}",
        )
        _require(
            lens[seq] <= dims.max_seq_len,
            f"seq_lens[{seq}] = {lens[seq]} exceeds max_seq_len {dims.max_seq_len}",
        )
    _check_block_ids(dims, block_table, lens)


def _check_block_ids(dims: AttentionDims, block_table: torch.Tensor, lens: list[int]) -> None:
    for seq, seq_len in enumerate(lens):
        used = -(-seq_len // dims.block_size)
        if used == 0:
            continue
        ids = block_table[seq, :used]
        low, high = int(ids.min()), int(ids.max())
        _require(
            low >= 0 and high < dims.num_blocks,
            f"block_table row {seq} uses block ids in [{low}, {high}] outside the cache's "
            f"{dims.num_blocks} blocks",
        )


def check_cache_values(dims: CacheDims, slot_mapping: torch.Tensor) -> None:
    """Check that every non-negative slot addresses the cache (reads ``slot_mapping``)."""
    if dims.num_tokens == 0:
        return
    low = int(slot_mapping.min())
    _require(low >= -1, f"slot_mapping holds {low}; only -1 marks a skipped token")
    high = int(slot_mapping.max())
    num_slots = dims.num_blocks * dims.block_size
    _require(high < num_slots, f"slot_mapping holds slot {high} but the cache has {num_slots}")
