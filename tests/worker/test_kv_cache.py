"""KV cache sizing rules (engine/worker/kv_cache.py)."""

from __future__ import annotations

import pytest
import torch

from engine.worker.errors import KVCacheSizeError
from engine.worker.kv_cache import (
    KVCacheSpec,
    allocate_kv_caches,
    check_num_blocks,
    cuda_kv_cache_bytes,
    num_blocks_for_bytes,
)

SPEC = KVCacheSpec(num_layers=32, block_size=16, num_kv_heads=8, head_dim=128,
                   dtype=torch.bfloat16)


def test_bytes_per_block_of_llama_8b() -> None:
    # KERNELS.md: 128 KiB per context token over 32 layers for Llama-3.1-8B in bf16.
    assert SPEC.bytes_per_block == 16 * 128 * 1024
    assert num_blocks_for_bytes(SPEC, 10 * SPEC.bytes_per_block + 5) == 10


def test_cuda_rule() -> None:
    gib = 1 << 30
    kv = cuda_kv_cache_bytes(total_bytes=140 * gib, gpu_memory_utilization=0.9,
                             torch_peak_bytes=18 * gib, non_torch_bytes=2 * gib)
    assert kv == int(126 * gib) - 20 * gib


def test_one_sequence_must_fit() -> None:
    check_num_blocks(SPEC, 65, max_model_len=1024, source="x")  # 64 blocks + the null block
    with pytest.raises(KVCacheSizeError, match="needs 65 blocks"):
        check_num_blocks(SPEC, 64, max_model_len=1024, source="x")


def test_allocation_layout() -> None:
    spec = KVCacheSpec(2, 4, 2, 8, torch.float32)
    caches = allocate_kv_caches(spec, 5, torch.device("cpu"))
    assert len(caches) == 2
    k, v = caches[1]
    assert k.shape == v.shape == (5, 4, 2, 8) and k.is_contiguous()
    assert k.data_ptr() != v.data_ptr()
