"""The parallel layout of a deployment — tensor, pipeline and data parallelism — shared by both
worlds (vLLM's ``ParallelConfig``).

A deployment runs ``data_parallel_size`` engine replicas; each drives a model replica split over
``pipeline_parallel_size`` stages of ``tensor_parallel_size`` ranks (one device per rank). The
rules that decide whether a model can be split so, and how its layers are split over stages,
live here once: the real worker builds its shard with them, the simulator prices a stage with
them, and both refuse the same layouts with the same messages.

Rank order is vLLM's: within one replica the global rank of (pipeline stage ``p``, tensor rank
``t``) is ``p × tensor_parallel_size + t``, so a stage's TP ranks are neighbours (one node).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import ConfigError, is_int

#: The largest degree of any one kind of parallelism a layout may ask for.
MAX_PARALLEL_SIZE = 1024


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """How one deployment is split. Invariant: every degree is an integer in [1, 1024]."""

    tensor_parallel_size: int = 1  # ranks sharing each layer (an all-reduce per layer)
    pipeline_parallel_size: int = 1  # stages the layers are split over
    data_parallel_size: int = 1  # engine replicas, each with its own scheduler and KV cache

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not (is_int(value) and 1 <= value <= MAX_PARALLEL_SIZE):
                raise ConfigError(
                    f"{name} must be an integer in [1, {MAX_PARALLEL_SIZE}], got {value!r}"
                )

    @property
    def world_size(self) -> int:
        """Ranks (devices) of one engine replica: TP × PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_devices(self) -> int:
        """Devices of the whole deployment: TP × PP × DP."""
        return self.world_size * self.data_parallel_size

    def rank(self, pp_rank: int, tp_rank: int) -> int:
        """The rank of (stage ``pp_rank``, tensor rank ``tp_rank``) within its replica."""
        return pp_rank * self.tensor_parallel_size + tp_rank

    def check_model(self, num_heads: int, num_kv_heads: int, num_layers: int,
                    name: str = "the model") -> None:
        """Refuse a layout the model cannot be split into (one ``ConfigError`` each):
        TP must divide the attention heads, and divide or be a multiple of the KV heads (KV
        heads are replicated when TP exceeds them, as vLLM does); PP cannot exceed the layers."""
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        if num_heads % tp:
            raise ConfigError(
                f"tensor_parallel_size {tp} does not divide {name}'s {num_heads} attention "
                f"heads; use a divisor of {num_heads}"
            )
        if num_kv_heads % tp and tp % num_kv_heads:
            raise ConfigError(
                f"tensor_parallel_size {tp} neither divides nor is a multiple of {name}'s "
                f"{num_kv_heads} KV heads"
            )
        if pp > num_layers:
            raise ConfigError(
                f"pipeline_parallel_size {pp} exceeds {name}'s {num_layers} decoder layers "
                "(every stage needs at least one)"
            )


def check_device_count(num_ranks: int, num_devices: int, kind: str = "GPU") -> None:
    """Refuse a layout with more ranks than the machine has devices (one device per rank)."""
    if num_ranks > num_devices:
        raise ConfigError(
            f"the layout needs {num_ranks} {kind}s (one per rank: TP × PP × DP) but this "
            f"machine has {num_devices}; lower tensor/pipeline/data_parallel_size"
        )


def worker_process_name(parallel: ParallelConfig, pp_rank: int, tp_rank: int) -> str:
    """vLLM's name of a worker process: ``Worker_TPt``, with the stage first when PP > 1."""
    if parallel.pipeline_parallel_size > 1:
        return f"Worker_PP{pp_rank}_TP{tp_rank}"
    return f"Worker_TP{tp_rank}"


def pp_layer_partition(num_layers: int, pipeline_parallel_size: int) -> tuple[int, ...]:
    """Decoder layers of each stage, as vLLM's ``get_pp_indices``: equal shares, and the
    remainder one each to the stages just before the last (the last stage also holds the final
    norm and the LM head)."""
    pp = pipeline_parallel_size
    if not 1 <= pp <= num_layers:
        raise ConfigError(
            f"pipeline_parallel_size {pp} must be in [1, {num_layers}] (the decoder layers)"
        )
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def pp_layer_range(num_layers: int, pipeline_parallel_size: int, pp_rank: int) -> range:
    """The decoder layers stage ``pp_rank`` holds."""
    parts = pp_layer_partition(num_layers, pipeline_parallel_size)
    start = sum(parts[:pp_rank])
    return range(start, start + parts[pp_rank])
