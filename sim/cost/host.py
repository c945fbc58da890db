"""The host (CPU) side of one vLLM 0.33 step: preparing inputs and launching the kernels.

Per step the worker updates its persistent input batch, builds the attention metadata and
copies the inputs to the GPU (``prepare``), then launches the step: one FULL-graph replay; or
the PIECEWISE graph pieces (one per layer boundary) with attention and the KV-cache update run
eagerly between them; or, without graphs, every kernel from Inductor's wrapper. The LM head,
the logits gather and the sampler always run eagerly after the forward pass.

``HostCosts`` holds the per-unit times. The defaults are estimates: no operator-level
measurement of vLLM 0.33's host path was available (``bench/gpu_step_times.py`` measures graph
replay and eager launch on a GPU; docs/cost_model.md §3 lists the sources). They are never
derived from serving results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from engine.core.config import ConfigError
from sim.cost.cuda_graphs import EAGER, FULL, PIECEWISE

#: Kernels of one decoder layer launched from the host without graphs: 2 fused add+RMSNorms,
#: 4 GEMMs, rotary, KV-cache update, attention, SiLU-and-mul (+ 2 all-reduces at TP > 1).
KERNELS_PER_LAYER = 10
#: Kernels per step around the layers in eager mode: embedding, final norm.
KERNELS_PER_STEP = 2
#: Eager custom ops between PIECEWISE graph pieces per layer: KV-cache update, attention.
EAGER_OPS_PER_LAYER = 2
#: Kernels after the forward pass, always eager: LM head, logits processing and the sampler
#: (temperature, softmax, top-k/top-p sampling, gather of the sampled ids).
SAMPLER_KERNELS = 8


@dataclass(frozen=True, slots=True)
class HostCosts:
    """Worker CPU time per unit of a step's host work (seconds; estimates, see module doc)."""

    prepare_s: float = 1e-4  # persistent batch update + attention metadata + input copies
    prepare_s_per_request: float = 1e-6  # ... per scheduled request
    graph_replay_s: float = 1e-5  # one CUDA-graph launch (FULL graph or one PIECEWISE piece)
    eager_op_s: float = 1.5e-5  # one eager custom op between pieces (Python wrapper + launch)
    kernel_launch_s: float = 5e-6  # one kernel launch without a graph

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and 0.0 <= value < 1.0 and math.isfinite(value)):
                raise ConfigError(f"host cost {f.name} must be a number of seconds in [0, 1), "
                                  f"got {value!r}")


def launches(mode: int, num_layers: int, tp: int) -> tuple[int, int, int]:
    """(graph replays, eager custom ops, kernel launches) of one step in ``mode``."""
    if mode == FULL:
        return 1, 0, SAMPLER_KERNELS
    if mode == PIECEWISE:
        return num_layers + 1, EAGER_OPS_PER_LAYER * num_layers, SAMPLER_KERNELS
    if mode != EAGER:
        raise ValueError(f"unknown mode {mode}")
    per_layer = KERNELS_PER_LAYER + (2 if tp > 1 else 0)
    return 0, 0, num_layers * per_layer + KERNELS_PER_STEP + SAMPLER_KERNELS


def launch_s(costs: HostCosts, mode: int, num_layers: int, tp: int) -> float:
    """Host time spent launching one step's work in ``mode``."""
    graphs, ops, kernels = launches(mode, num_layers, tp)
    return graphs * costs.graph_replay_s + ops * costs.eager_op_s + (
        kernels * costs.kernel_launch_s
    )
