"""Which Triton kernel runs a batch, with how many KV splits, and with which tile shapes.

Responsibility: pure functions of host-side sizes (no tensors, no device syncs, no Triton import)
so the choice is cheap, testable and the same on every call with the same bounds.

Selection rule (``plan_attention``):

* a batch with ``max_query_len > 1`` (any prefill or chunked-prefill token) runs the **unified**
  varlen kernel: one launch, grid ``(num_tokens // block_q + num_seqs, num_kv_heads)``;
* a decode-only batch (``max_query_len == 1``) runs the **decode** kernel with ``num_splits`` KV
  segments per sequence (``choose_num_splits``): split only when ``num_seqs * num_kv_heads``
  programs cannot keep ``PROGRAMS_PER_SM`` programs on every SM, and never so finely that a
  segment streams fewer than ``MIN_TOKENS_PER_SPLIT`` tokens of the longest context. With more than
  one split a second, tiny kernel merges the partial outputs by their log-sum-exp.

Both grids depend only on sizes and host-side upper bounds, so a CUDA graph captured with bounds
stays valid for every batch within them.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

#: A KV segment should stream at least this many tokens, or the merge and per-program set-up
#: stop being negligible next to the K/V reads.
MIN_TOKENS_PER_SPLIT = 512
#: Upper bound on KV segments per sequence (the merge kernel holds them in one register tile).
MAX_SPLITS = 32
#: Programs per SM the decode grid aims for, so enough loads are in flight to saturate HBM.
PROGRAMS_PER_SM = 4
#: SM count assumed when no CUDA device is asked (the Triton interpreter): an H200's.
DEFAULT_NUM_SMS = 132
#: Smallest tile edge ``tl.dot`` accepts.
MIN_DOT_SIZE = 16


class AttentionKernel(enum.Enum):
    """The Triton kernel a batch runs on."""

    UNIFIED = "unified"  # varlen, mixed prefill + decode, causal with context offset
    DECODE = "decode"  # one query token per sequence, optional split-KV + merge


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """The kernel choice for one batch. Invariant: ``num_splits == 1`` unless ``DECODE``."""

    kernel: AttentionKernel  # which kernel runs
    num_splits: int  # KV segments per sequence (1 = no split, no merge launch)


@dataclass(frozen=True, slots=True)
class TileConfig:
    """Compile-time tile shape and launch options of one attention kernel.

    Invariants: ``block_m`` and ``tile_size`` are powers of two >= 16 (``tl.dot``'s minimum);
    ``block_m >= num_queries_per_kv`` so one tile holds a whole GQA group.
    """

    block_m: int  # query-tile rows: query tokens x the GQA heads of one KV head
    tile_size: int  # KV positions per loop iteration
    num_warps: int  # warps per program (ignored by the interpreter)
    num_stages: int  # software-pipelining depth of the KV loop (ignored by the interpreter)

    def __post_init__(self) -> None:
        for name in ("block_m", "tile_size"):
            size = getattr(self, name)
            if size < MIN_DOT_SIZE or size & (size - 1):
                raise ValueError(f"{name} must be a power of two >= {MIN_DOT_SIZE}, got {size}")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError("num_warps and num_stages must be >= 1")


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def dot_size(n: int) -> int:
    """``n`` padded to a size ``tl.dot`` accepts: a power of two, at least ``MIN_DOT_SIZE``."""
    return max(MIN_DOT_SIZE, next_power_of_2(n))


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def choose_num_splits(
    *, num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int
) -> int:
    """KV segments per sequence for a decode batch (see the module docstring)."""
    programs = num_seqs * num_kv_heads
    if programs == 0:
        return 1
    wanted = cdiv(PROGRAMS_PER_SM * num_sms, programs)
    affordable = max_seq_len // MIN_TOKENS_PER_SPLIT
    return max(1, min(wanted, affordable, MAX_SPLITS))


def plan_attention(
    *, num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int, num_sms: int
) -> AttentionPlan:
    """The kernel and split count for one batch, from host-side sizes only."""
    if max_query_len > 1:
        return AttentionPlan(AttentionKernel.UNIFIED, 1)
    splits = choose_num_splits(
        num_seqs=num_seqs, num_kv_heads=num_kv_heads, max_seq_len=max_seq_len, num_sms=num_sms
    )
    return AttentionPlan(AttentionKernel.DECODE, splits)


@functools.lru_cache(maxsize=16)
def device_num_sms(device: torch.device) -> int:
    """SMs of a CUDA device (queried once per device); ``DEFAULT_NUM_SMS`` elsewhere."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def previous_power_of_2(n: int) -> int:
    """Largest power of two <= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


def unified_tile_config(
    *, num_queries_per_kv: int, max_query_len: int, mean_query_len: int, head_dim: int
) -> TileConfig:
    """Tiles of the unified kernel, sized by how many query rows a sequence typically has.

    ``block_m`` is the largest power of two <= (typical query length x GQA group), where the
    typical length is ``min(max_query_len, mean_query_len)``, clamped to [16 (or the GQA group),
    128] (64 for head dims above 128, to stay clear of register spills). Prefill-heavy batches get
    128-row tiles with 8 warps; a mixed batch dominated by decodes gets small tiles, so its decode
    rows do not waste tensor-core work on empty rows.
    """
    group = dot_size(num_queries_per_kv)
    head_dim_padded = next_power_of_2(head_dim)
    cap = 128 if head_dim_padded <= 128 else 64
    rows = previous_power_of_2(min(max_query_len, mean_query_len) * num_queries_per_kv)
    block_m = max(group, min(cap, rows))
    if block_m >= 128:
        return TileConfig(block_m=block_m, tile_size=64, num_warps=8, num_stages=2)
    wide = block_m <= 32 and head_dim_padded <= 128
    return TileConfig(block_m=block_m, tile_size=64 if wide else 32, num_warps=4, num_stages=2)


def decode_tile_config(*, num_queries_per_kv: int, head_dim: int) -> TileConfig:
    """Tiles of the decode kernel: one GQA group per program, long KV tiles."""
    block_m = dot_size(num_queries_per_kv)
    tile_size = 64 if next_power_of_2(head_dim) <= 128 else 32
    return TileConfig(block_m=block_m, tile_size=tile_size, num_warps=4, num_stages=2)
