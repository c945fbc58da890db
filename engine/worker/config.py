"""Frozen, validated configuration of the torch worker (one process, one device).

``WorkerConfig`` holds what the engine core does not need to know: where the checkpoint is, the
device and dtype, how to size the KV cache, the attention backend and the engine's sampling seed.
Scheduling limits (token budget, max_num_seqs, max_model_len) and the block size come from the
core's own ``SchedulerConfig`` / ``CacheConfig`` so the two sides can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.core.config import ConfigError

LoadFormat = Literal["safetensors", "dummy"]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How to build the worker. Invariants: sizes are positive; utilization is in (0, 1]."""

    model: str  # local checkpoint directory (config.json + safetensors)
    dtype: str = "auto"  # "auto" (config.json's dtype), "float32", "float16", "bfloat16"
    device: str = "auto"  # "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:N"
    load_format: LoadFormat = "safetensors"  # "dummy": random weights (benchmarks, smoke runs)
    kv_cache_memory_bytes: int | None = None  # KV bytes; None = profile (CUDA) / 1 GiB (CPU)
    gpu_memory_utilization: float = 0.9  # CUDA: fraction of total memory this engine may use
    num_gpu_blocks_override: int | None = None  # exact block count (incl. the null block)
    attention_backend: str | None = None  # None = kernels.select_backend's default
    seed: int = 0  # engine-wide sampling seed (requests without their own seed)
    dummy_weight_std: float = 0.02  # std of dummy weights

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("model must be a checkpoint directory path")
        if self.load_format not in ("safetensors", "dummy"):
            raise ConfigError(
                f"load_format must be 'safetensors' or 'dummy', got {self.load_format!r}"
            )
        if self.kv_cache_memory_bytes is not None and not (
            isinstance(self.kv_cache_memory_bytes, int) and self.kv_cache_memory_bytes > 0
        ):
            raise ConfigError(
                f"kv_cache_memory must be a positive number of bytes, got "
                f"{self.kv_cache_memory_bytes!r}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if self.num_gpu_blocks_override is not None and not (
            isinstance(self.num_gpu_blocks_override, int) and self.num_gpu_blocks_override >= 2
        ):
            raise ConfigError(
                "num_gpu_blocks must be an integer >= 2 (block 0 is the null block), got "
                f"{self.num_gpu_blocks_override!r}"
            )
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")
        if not self.dummy_weight_std > 0:
            raise ConfigError(f"dummy_weight_std must be > 0, got {self.dummy_weight_std!r}")
