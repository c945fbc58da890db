"""Which slice of each layer and checkpoint tensor one tensor-parallel rank holds.

Responsibility: the sizes of a TP rank's shard (``ShardPlan``) and, for each checkpoint tensor,
which rows or columns of it go where in the rank's fused parameters (``WeightTarget``) — the
same arithmetic as vLLM's parallel layers' ``weight_loader``s:

* query heads, the MLP width and the vocabulary are split evenly, rank ``t`` taking the
  ``t``-th contiguous slice (the vocabulary in slices of ``ceil(vocab / tp)`` rows; the last
  rank's padding rows stay zero and their logits are cut off after the all-gather);
* KV heads are split when TP divides them and replicated when TP is a multiple of them: rank
  ``t`` then holds KV head ``t // (tp / num_kv_heads)``, the one its query heads attend with;
* column-parallel tensors (q/k/v, gate/up, embedding, LM head) are cut along their rows,
  row-parallel ones (o, down) along their columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.errors import CheckpointError
from engine.worker.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class WeightTarget:
    """Copy ``source.narrow(dim, src_start, length)`` into
    ``param.narrow(dim, dest_start, length)`` (the whole tensor when ``length`` is None)."""

    param: str  # our parameter's name
    dim: int  # the dimension that is cut (0: rows, 1: columns)
    src_start: int
    dest_start: int
    length: int | None  # None: the whole tensor, shapes must match
    full_size: int = 0  # the checkpoint tensor's size along ``dim`` (config.json's)

    @staticmethod
    def whole(param: str) -> WeightTarget:
        return WeightTarget(param, 0, 0, 0, None)

    def copy(self, source: torch.Tensor, param: torch.Tensor, name: str, where: str) -> None:
        dest = param.data
        src = source
        if self.length is not None:
            dim = min(self.dim, source.dim() - 1)  # a bias is cut along its only dimension
            if source.shape[dim] != self.full_size:
                expected = list(source.shape)
                expected[dim] = self.full_size
                raise CheckpointError(
                    f"{where}: tensor {name!r} has shape {tuple(source.shape)}, expected "
                    f"{tuple(expected)} from config.json"
                )
            # the last vocabulary slice may be shorter than its (padded) rows
            length = max(0, min(self.length, self.full_size - self.src_start))
            src = source.narrow(dim, self.src_start, length)
            dest = dest.narrow(dim, self.dest_start, length)
        if tuple(src.shape) != tuple(dest.shape):
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(src.shape)}, expected "
                f"{tuple(dest.shape)} from config.json"
            )
        dest.copy_(src.to(device=dest.device, dtype=dest.dtype))


@dataclass(frozen=True, slots=True)
class _Slice:
    """``length`` rows/columns from ``src_start`` of a checkpoint tensor along ``dim``, to
    ``dest_start`` of a parameter."""

    dim: int
    src_start: int
    length: int
    full_size: int  # the checkpoint tensor's size along ``dim``
    dest_start: int = 0

    def into(self, param: str) -> WeightTarget:
        return WeightTarget(param, self.dim, self.src_start, self.dest_start, self.length,
                            self.full_size)


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """The sizes of one TP rank's shard of a model."""

    tp_size: int
    tp_rank: int
    head_dim: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    kv_head_start: int  # index of this rank's first KV head in the checkpoint
    intermediate_size: int  # this rank's slice of the MLP width
    vocab_per_rank: int  # rows of this rank's embedding / LM head slice (padded)
    vocab_size: int  # the whole vocabulary
    total_heads: int  # query heads of the whole model
    total_kv_heads: int  # KV heads of the whole model
    total_intermediate_size: int  # MLP width of the whole model

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def vocab_start(self) -> int:
        return self.tp_rank * self.vocab_per_rank

    def q_rows(self, dest_start: int) -> _Slice:
        return _Slice(0, self.tp_rank * self.q_size, self.q_size,
                      self.total_heads * self.head_dim, dest_start)

    def kv_rows(self, dest_start: int) -> _Slice:
        return _Slice(0, self.kv_head_start * self.head_dim, self.kv_size,
                      self.total_kv_heads * self.head_dim, dest_start)

    def q_columns(self) -> _Slice:
        return _Slice(1, self.tp_rank * self.q_size, self.q_size,
                      self.total_heads * self.head_dim)

    def mlp_rows(self, dest_start: int) -> _Slice:
        return _Slice(0, self.tp_rank * self.intermediate_size, self.intermediate_size,
                      self.total_intermediate_size, dest_start)

    def mlp_columns(self) -> _Slice:
        return _Slice(1, self.tp_rank * self.intermediate_size, self.intermediate_size,
                      self.total_intermediate_size)

    def vocab_rows(self) -> _Slice:
        return _Slice(0, self.vocab_start, self.vocab_per_rank, self.vocab_size)


def shard_plan(config: ModelConfig, tp_size: int, tp_rank: int) -> ShardPlan:
    """The shard of TP rank ``tp_rank`` (the layout must pass ``ParallelConfig.check_model``)."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if tp_size >= kv_heads:
        num_kv, kv_start = 1, tp_rank // (tp_size // kv_heads)
    else:
        num_kv = kv_heads // tp_size
        kv_start = tp_rank * num_kv
    if config.intermediate_size % tp_size:
        raise CheckpointError(
            f"tensor_parallel_size {tp_size} does not divide intermediate_size "
            f"{config.intermediate_size}"
        )
    return ShardPlan(
        tp_size=tp_size,
        tp_rank=tp_rank,
        head_dim=config.head_dim,
        num_heads=heads // tp_size,
        num_kv_heads=num_kv,
        kv_head_start=kv_start,
        intermediate_size=config.intermediate_size // tp_size,
        vocab_per_rank=-(-config.vocab_size // tp_size),
        vocab_size=config.vocab_size,
        total_heads=heads,
        total_kv_heads=kv_heads,
        total_intermediate_size=config.intermediate_size,
    )
