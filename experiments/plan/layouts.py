"""The layouts a GPU budget can hold: TP × PP × EP × weight dtype, and their replica counts.

With ``--num-gpus N`` the planner builds its candidates here instead of from ``--tp``/``--dp``
lists. A *unit* is what one ``vllm serve`` engine group runs and the capacity search probes:

* dense models: one engine of ``TP × PP`` GPUs; the deployment runs ``N / (TP × PP)``
  replicas of it behind the router (vLLM's ``--data-parallel-size``);
* mixture-of-experts models: one engine group of ``TP × DP = N`` GPUs, because vLLM shards
  MoE layers over the whole TP × DP world — slices of every expert, or whole experts with
  ``--enable-expert-parallel`` (both are candidates): the unit is the whole deployment.

Search dimensions are a table (``DIMENSIONS``), so a dimension the simulator gains slots in
as one row: pipeline parallelism is enumerated for dense models where ``SimConfig`` has a
``pipeline_parallel_size`` field (``pipeline_parallel_supported``; otherwise ``--pp`` sizes
other than 1 are refused with that reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.errors import UserError
from sim.hardware import get_gpu
from sim.models import ModelSpec

#: ``--expert-parallel`` choices: both layouts for MoE models, only EP, or none.
EP_MODES = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class LayoutChoice:
    """One unit's parallel layout and dtype (the GPU kind comes with the candidate)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1  # >1 only for an expert-parallel group
    expert_parallel: bool = False
    quantization: str | None = None  # vLLM --quantization (None: the checkpoint's dtype)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


def pipeline_parallel_supported() -> bool:
    """Whether the simulator can run PP layouts (``SimConfig.pipeline_parallel_size``)."""
    from sim.config import SimConfig

    return "pipeline_parallel_size" in {f.name for f in dataclasses.fields(SimConfig)}


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _tp_pp(budget: int, model: ModelSpec, pp_sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(TP, PP) pairs whose GPUs divide the budget and whose TP divides the heads."""
    out = []
    for pp in pp_sizes:
        for tp in _powers_of_two(budget // pp):
            if budget % (tp * pp) or model.num_heads % tp:
                continue
            if model.num_kv_heads % tp and tp % model.num_kv_heads:
                continue
            out.append((tp, pp))
    return out


#: The search dimensions: each maps the layouts so far to the layouts with its choices.
Dimension = Callable[[list[LayoutChoice], "SpaceSpec"], list[LayoutChoice]]


@dataclass(frozen=True, slots=True)
class SpaceSpec:
    """What the budget search enumerates."""

    model: ModelSpec
    gpu: str
    num_gpus: int
    pp_sizes: tuple[int, ...] = (1,)
    quantizations: tuple[str | None, ...] = (None,)
    expert_parallel: str = "auto"


def _parallel(layouts: list[LayoutChoice], space: SpaceSpec) -> list[LayoutChoice]:
    out = []
    moe = space.model.is_moe
    ep_modes = {"auto": (False, True), "on": (True,), "off": (False,)}[space.expert_parallel]
    for tp, pp in _tp_pp(space.num_gpus, space.model, space.pp_sizes):
        if not moe:
            out.append(LayoutChoice(tp, pp))
            continue
        if pp > 1:
            continue  # MoE groups are TP × DP here; PP × DP groups need the simulator's PP
        dp = space.num_gpus // tp
        for ep in ep_modes:
            if ep and tp * dp > space.model.num_experts:
                continue  # vLLM needs at least one expert per rank
            out.append(LayoutChoice(tp, 1, dp, ep))
    return out


def _dtype(layouts: list[LayoutChoice], space: SpaceSpec) -> list[LayoutChoice]:
    fp8 = get_gpu(space.gpu).fp8_tflops is not None
    out = []
    for layout in layouts:
        for q in space.quantizations:
            if q is not None and (not fp8 or space.model.linear_weight_bytes == 1):
                continue  # no fp8 tensor cores, or an fp8 checkpoint already
            out.append(dataclasses.replace(layout, quantization=q))
    return out


DIMENSIONS: tuple[Dimension, ...] = (_parallel, _dtype)


def budget_layouts(space: SpaceSpec) -> list[LayoutChoice]:
    """Every unit layout the budget holds (see the module docstring)."""
    if any(pp > 1 for pp in space.pp_sizes) and not pipeline_parallel_supported():
        raise UserError("--pp sizes other than 1 need pipeline parallelism in the simulator "
                        "(SimConfig.pipeline_parallel_size), which this build lacks")
    if space.num_gpus < 1:
        raise UserError(f"--num-gpus must be >= 1, got {space.num_gpus}")
    if space.expert_parallel == "on" and not space.model.is_moe:
        raise UserError(f"--expert-parallel on needs a mixture-of-experts model; "
                        f"{space.model.name} ({space.model.architecture}) is dense")
    layouts: list[LayoutChoice] = []  # the first dimension enumerates, the others refine
    for dim in DIMENSIONS:
        layouts = dim(layouts, space)
    return layouts
