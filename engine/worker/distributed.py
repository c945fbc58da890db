"""One rank's place in a parallel model replica, and the collectives it runs (torch.distributed).

Responsibility: say which part of the model this rank computes (its tensor rank and pipeline
stage, ``engine.core.parallel``'s rank order) and carry its communication — the all-reduce
after each row-parallel layer and the all-gather of the vocab-parallel logits within its TP
group, and the hidden states sent from each stage to the next. ``SINGLE_RANK`` is the one-rank
context of an in-process engine: every collective is the identity and nothing is initialised.

Backends: ``gloo`` on CPU (so TP and PP run on any machine), ``nccl`` on CUDA. Every rank of a
replica joins one process group (``init_distributed``) and every TP group is created on every
rank, in the same order, as torch.distributed requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.core.parallel import ParallelConfig


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where a rank sits in its replica (no process group: safe to pickle and to print)."""

    parallel: ParallelConfig
    rank: int  # pp_rank × tensor_parallel_size + tp_rank

    @property
    def tp_size(self) -> int:
        return self.parallel.tensor_parallel_size

    @property
    def pp_size(self) -> int:
        return self.parallel.pipeline_parallel_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_output_rank(self) -> bool:
        """The rank that returns the sampled tokens: TP rank 0 of the last stage (vLLM's)."""
        return self.is_last_stage and self.tp_rank == 0


class ParallelContext:
    """A rank's place plus its process groups; the collectives are no-ops at size 1."""

    def __init__(self, place: RankPlace, tp_group: object | None = None) -> None:
        self.place = place
        self._tp_group = tp_group

    @property
    def distributed(self) -> bool:
        return self.place.parallel.world_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the TP group, in place (row-parallel outputs, vocab-parallel
        embeddings)."""
        if self.place.tp_size > 1:
            dist.all_reduce(x, group=self._tp_group)  # type: ignore[arg-type]
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every TP rank's ``x`` along the last dimension, in rank order."""
        n = self.place.tp_size
        if n == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=self._tp_group)  # type: ignore[arg-type]
        return torch.cat(parts, dim=-1)

    def send_to_next_stage(self, x: torch.Tensor) -> None:
        """Send this stage's hidden states to the same TP rank of the next stage."""
        dist.send(x.contiguous(), dst=self.place.rank + self.place.tp_size)

    def recv_from_previous_stage(self, shape: tuple[int, ...], dtype: torch.dtype,
                                 device: torch.device) -> torch.Tensor:
        """The previous stage's hidden states for this step."""
        buf = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(buf, src=self.place.rank - self.place.tp_size)
        return buf

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest ``value`` any rank of the replica has (the KV block count all ranks
        can hold)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


SINGLE_RANK = ParallelContext(RankPlace(ParallelConfig(), 0))


def backend_for(device: torch.device) -> str:
    """``nccl`` on CUDA, ``gloo`` elsewhere."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(place: RankPlace, init_method: str, device: torch.device,
                     timeout_s: float = 600.0) -> ParallelContext:
    """Join the replica's process group and create its TP groups (collective: every rank of
    the replica calls this)."""
    import datetime

    parallel = place.parallel
    kwargs: dict[str, object] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=backend_for(device), init_method=init_method, rank=place.rank,
        world_size=parallel.world_size, timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,  # type: ignore[arg-type]
    )
    tp_group = None
    tp = parallel.tensor_parallel_size
    for stage in range(parallel.pipeline_parallel_size):
        ranks = list(range(stage * tp, (stage + 1) * tp))
        group = dist.new_group(ranks) if tp > 1 else None
        if stage == place.pp_rank:
            tp_group = group
    return ParallelContext(place, tp_group)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
