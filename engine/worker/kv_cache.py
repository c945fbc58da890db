"""Sizing and allocating the paged KV cache.

Responsibility: how many KV blocks an engine gets (``num_gpu_blocks``, null block 0 included) and
the per-layer cache tensors ``k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]``.

Sizing rules, first match wins:

1. ``num_gpu_blocks_override`` — exactly that many blocks;
2. ``kv_cache_memory_bytes`` — that many bytes of KV (on any device; vLLM's knob of that name);
3. CUDA — vLLM's rule: ``gpu_memory_utilization`` is the fraction of the device's *total* memory
   this engine may use; the KV cache gets that budget minus the torch peak of a profiling forward
   at the full token budget (weights + activations) minus memory torch does not manage (CUDA
   context, other processes);
4. CPU — ``DEFAULT_CPU_KV_CACHE_BYTES``.

Whatever the rule, the cache must hold one ``max_model_len`` sequence (vLLM's check), or
``KVCacheSizeError`` says how much memory that needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.errors import KVCacheSizeError
from engine.worker.model_config import ModelConfig

#: KV bytes on a CPU device when no size is given (vLLM's CPU backend defaults to 4 GiB).
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30


def format_bytes(num_bytes: float) -> str:
    """``1536`` → ``1.5 KiB``; for messages."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """Shape of the cache. Invariant: one block holds ``block_size`` tokens of every layer."""

    num_layers: int  # decoder layers (one K and one V tensor each)
    block_size: int  # tokens per block
    num_kv_heads: int  # KV heads per layer
    head_dim: int  # elements per head
    dtype: torch.dtype  # cache element type (the model's dtype)

    @staticmethod
    def for_model(config: ModelConfig, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        return KVCacheSpec(
            config.num_hidden_layers, block_size, config.num_key_value_heads, config.head_dim,
            dtype,
        )

    @staticmethod
    def for_shard(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                  dtype: torch.dtype) -> KVCacheSpec:
        """One rank's cache: its stage's layers and its (possibly replicated) KV heads."""
        return KVCacheSpec(num_layers, block_size, num_kv_heads, head_dim, dtype)

    @property
    def bytes_per_block(self) -> int:
        """K and V of ``block_size`` tokens across all layers."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


def cuda_kv_cache_bytes(
    *, total_bytes: int, gpu_memory_utilization: float, torch_peak_bytes: int, non_torch_bytes: int
) -> int:
    """KV bytes under rule 3: ``total × utilization − torch peak − non-torch memory``."""
    return int(total_bytes * gpu_memory_utilization) - torch_peak_bytes - non_torch_bytes


def num_blocks_for_bytes(spec: KVCacheSpec, kv_bytes: int) -> int:
    return max(0, kv_bytes // spec.bytes_per_block)


def check_num_blocks(spec: KVCacheSpec, num_blocks: int, max_model_len: int, source: str) -> None:
    """Raise KVCacheSizeError unless ``num_blocks`` (incl. the null block) hold one sequence."""
    needed = spec.blocks_for_tokens(max_model_len) + 1
    if num_blocks >= needed:
        return
    have = format_bytes(num_blocks * spec.bytes_per_block)
    need = format_bytes(needed * spec.bytes_per_block)
    raise KVCacheSizeError(
        f"the KV cache ({source}) has {num_blocks} blocks of {spec.block_size} tokens "
        f"({have}), but one sequence of max_model_len={max_model_len} tokens needs "
        f"{needed} blocks incl. the null block ({need}); give more KV memory or "
        "blocks, or lower max_model_len"
    )


def allocate_kv_caches(
    spec: KVCacheSpec, num_blocks: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed per-layer ``(k_cache, v_cache)`` views of one contiguous allocation."""
    storage = torch.zeros(
        spec.num_layers, 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim,
        dtype=spec.dtype, device=device,
    )
    return [(storage[i, 0], storage[i, 1]) for i in range(spec.num_layers)]
