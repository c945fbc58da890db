"""A step's time on each stage of a pipeline-parallel replica, and the sends between stages.

With ``P`` stages each micro-batch (one engine step) runs stage after stage: stage ``s`` runs
its decoder layers (``engine.core.parallel.pp_layer_partition``, vLLM's split) and sends the
hidden states to stage ``s + 1``; the last stage also computes the LM head and samples. The
replica keeps ``P`` batches in flight (the core's batch queue), so while stage 1 runs batch N,
stage 0 runs batch N+1 — and waits (a *bubble*) when the queue has fewer batches than stages
or the stages are unbalanced.

``PipelineCostModel`` prices a stage with the underlying cost model built for that stage's
layers (a ``ModelSpec`` with ``num_layers`` set to them): every per-layer term scales with its
share, and only the last stage's step has sampling rows (LM head, logits gather, sampler),
so PP 2 halves each stage's weight reads. A send moves the step's hidden states, ``tokens ×
hidden × 2`` bytes split over the TP ranks (vLLM sends each TP rank's slice and all-gathers it
on the next stage), over NVLink when both stages are on one node and over the network between
nodes (``sim.hardware.NetworkSpec``): ``latency + bytes / bandwidth``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.interfaces import CostModel, StepTime
from engine.core.outputs import BatchShape
from engine.core.parallel import pp_layer_partition
from sim.models import ModelSpec

#: Bytes per activation element sent between stages (bf16 hidden states).
ACTIVATION_BYTES = 2


@dataclass(frozen=True, slots=True)
class Link:
    """One hop between consecutive stages."""

    bandwidth_bytes_s: float  # per TP rank, one direction
    latency_s: float  # fixed cost of one send/recv
    kind: str  # "nvlink" or the network's name

    def send_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_s


@dataclass(frozen=True, slots=True)
class PipelineStepTime:
    """One step through every stage."""

    stage_s: tuple[float, ...]  # device time of the step on each stage
    send_s: tuple[float, ...]  # the send from stage s to stage s + 1 (P - 1 of them)
    host_s: float = 0.0  # host work before the first stage can start (as ``StepTime``)
    launch_s: float = 0.0  # host time launching the step

    @property
    def total_s(self) -> float:
        """The step's latency through an idle pipeline."""
        return sum(self.stage_s) + sum(self.send_s)


class PipelineCostModel:
    """``CostModel`` of a ``P``-stage replica: ``stage_times`` for the simulated pipeline,
    ``step_time`` for anything that wants one number (the latency through idle stages)."""

    def __init__(
        self,
        model: ModelSpec,
        pipeline_parallel_size: int,
        tensor_parallel_size: int,
        make_stage: Callable[[ModelSpec], CostModel],
        links: tuple[Link, ...],
    ) -> None:
        pp = pipeline_parallel_size
        self.partition = pp_layer_partition(model.num_layers, pp)
        if len(links) != pp - 1:
            raise ValueError(f"{pp} stages need {pp - 1} links, got {len(links)}")
        self.links = links
        self.model = model
        self.tensor_parallel_size = tensor_parallel_size
        by_layers: dict[int, CostModel] = {}
        for n in self.partition:
            if n not in by_layers:
                by_layers[n] = make_stage(dataclasses.replace(model, num_layers=n))
        self._stages = [by_layers[n] for n in self.partition]
        self._hidden_bytes = model.hidden_size * ACTIVATION_BYTES / tensor_parallel_size

    @property
    def pipeline_parallel_size(self) -> int:
        return len(self.partition)

    def stage_times(self, shape: BatchShape) -> PipelineStepTime:
        if shape.num_tokens == 0:
            return PipelineStepTime(tuple(0.0 for _ in self.partition),
                                    tuple(0.0 for _ in self.links))
        no_sampling = _without_sampling(shape)
        last = len(self._stages) - 1
        times = [
            m.step_time(shape if s == last else no_sampling) for s, m in enumerate(self._stages)
        ]
        nbytes = shape.num_tokens * self._hidden_bytes
        sends = tuple(link.send_s(nbytes) for link in self.links)
        return PipelineStepTime(
            tuple(t.total_s for t in times), sends,
            host_s=times[0].host_s, launch_s=max(t.launch_s for t in times),
        )

    def step_time(self, shape: BatchShape) -> StepTime:
        """The step through idle stages, with the sends as communication."""
        if shape.num_tokens == 0:
            return StepTime(total_s=0.0)
        no_sampling = _without_sampling(shape)
        last = len(self._stages) - 1
        parts = [
            m.step_time(shape if s == last else no_sampling) for s, m in enumerate(self._stages)
        ]
        sends = sum(link.send_s(shape.num_tokens * self._hidden_bytes) for link in self.links)
        return StepTime(
            total_s=sum(p.total_s for p in parts) + sends,
            linear_s=sum(p.linear_s for p in parts),
            attention_s=sum(p.attention_s for p in parts),
            communication_s=sum(p.communication_s for p in parts) + sends,
            overhead_s=sum(p.overhead_s for p in parts),
            host_s=parts[0].host_s,
            launch_s=max(p.launch_s for p in parts),
            terms=_merged_terms(parts, sends),
        )


def _without_sampling(shape: BatchShape) -> BatchShape:
    """The same batch on a stage that computes no logits."""
    return BatchShape(shape.num_reqs, shape.num_tokens, shape.prefill_query_lens,
                      shape.prefill_context_lens, shape.num_decode_reqs,
                      shape.decode_context_sum, shape.decode_context_max, 0)


def _merged_terms(parts: list[StepTime], sends: float) -> tuple[tuple[str, float], ...]:
    if not all(p.terms for p in parts):
        return ()
    total: dict[str, float] = {}
    for p in parts:
        for name, value in p.terms:
            total[name] = total.get(name, 0.0) + value
    total["pp_send_recv"] = sends
    return tuple(total.items())
