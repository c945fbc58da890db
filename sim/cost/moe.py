"""A mixture-of-experts layer on one GPU, as vLLM runs it: fused experts and EP communication.

vLLM runs a MoE layer's routed experts as one fused kernel (``fused_experts``): the ``T·k``
(token, expert) pairs are sorted by expert, and each expert the batch *touches* streams its
weights once for all its rows (grouped GEMMs for gate+up and down, SiLU-and-mul between, the
weighted sum at the end). Under uniform routing a batch of ``T`` tokens touches
``E · (1 − (1 − k/E)^T)`` of the ``E`` experts (``touched_experts``): a decode batch reads a
fraction of the expert weights, a prefill reads them all.

Layouts (``MoELayout``). vLLM shards a MoE layer over the whole ``TP × DP`` world ("MoE layers
will be sharded according to the product of the tensor, prefill-context, and data parallel
sizes", ``vllm/config/parallel.py``):

* tensor parallel (default): every rank holds every expert at ``1 / (TP·DP)`` of its width;
* expert parallel (``--enable-expert-parallel``): the experts are spread whole over the
  ``TP × DP`` ranks (vLLM's EP group).

With DP = 1 the tokens are already on every TP rank: no dispatch, and the combine is the
layer's all-reduce. With DP > 1 every rank computes its shard for the tokens of all DP ranks,
which the dispatch brings to it and the combine returns: with vLLM's default
``allgather_reducescatter`` backend an all-gather of the DP ranks' hidden states and a
reduce-scatter of the outputs (NCCL tables); with a true all-to-all backend (DeepEP, pplx,
FlashInfer; expert parallel only) each token goes to the ``min(k, ranks)`` ranks holding its
experts and back (NCCL all-to-all). DP ranks are assumed equally loaded (every rank's step
carries ``DP ×`` this rank's tokens through the experts); vLLM's lockstep with dummy batches
on idle ranks is not modelled.

Expert time comes from the measured fused-MoE tables where the GPU, dtype, shape and MoE
TP/EP are measured (``moe.csv``; EP or TP beyond the measured sizes is scaled from the largest
measured one above its floor). Otherwise it is estimated from the dense GEMM tables — each
touched expert's gate+up and down GEMMs on its share of the rows — times the *grouped-GEMM
efficiency*: measured ÷ dense estimate on the same GPU's measured shapes at the same token
count (the median over shapes), so even unmeasured shapes inherit what the fused kernel does
relative to dense GEMMs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache

from engine.core.config import ConfigError
from sim.cost.interp import Curve
from sim.cost.kernel_tables import KernelTables, MoEShape, load_tables
from sim.models import ModelSpec

#: The token counts the grouped-GEMM efficiency curve is evaluated at.
EFFICIENCY_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: The token counts an estimated expert curve is built on (linear between, proportional after).
ESTIMATE_TOKENS = tuple(sorted({*EFFICIENCY_TOKENS, *range(1, 257), 384, 768, 1536, 3072,
                                6144, 12288, 32768, 65536}))
#: vLLM's --all2all-backend values and how they are priced.
ALL2ALL_BACKENDS = ("allgather_reducescatter", "alltoall")


def touched_experts(num_experts: int, top_k: int, num_tokens: float) -> float:
    """Expected distinct experts ``num_tokens`` tokens route to (uniform top-k routing)."""
    if num_tokens <= 0:
        return 0.0
    miss: float = (1.0 - top_k / num_experts) ** num_tokens
    return num_experts * (1.0 - miss)


@dataclass(frozen=True, slots=True)
class MoELayout:
    """How one MoE layer is spread over the GPUs."""

    tensor_parallel_size: int
    data_parallel_size: int = 1
    expert_parallel: bool = False
    all2all_backend: str = "allgather_reducescatter"

    def __post_init__(self) -> None:
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise ConfigError(f"all2all backend must be one of {ALL2ALL_BACKENDS}, got "
                              f"{self.all2all_backend!r}")

    @property
    def world(self) -> int:
        """Ranks the MoE layer is sharded over: TP × DP."""
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def ep_size(self) -> int:
        """Ranks the experts are spread over whole (1: tensor-parallel experts)."""
        return self.world if self.expert_parallel else 1

    @property
    def moe_tp(self) -> int:
        """The slice of every expert's width one rank holds."""
        return 1 if self.expert_parallel else self.world


def _dtype_key(weight_dtype: str, model: ModelSpec) -> str:
    """The fused-MoE table dtype of the model's experts."""
    if model.expert_weight_bytes is not None and model.expert_weight_bytes < 1:
        return "w4a16_mxfp4"
    if weight_dtype == "fp8":
        return "fp8_block" if model.linear_weight_bytes == 1 else "fp8"
    return "bfloat16"


class MoECost:
    """One MoE layer's routed experts and EP communication on one GPU (seconds)."""

    def __init__(self, model: ModelSpec, tables: KernelTables, layout: MoELayout,
                 weight_dtype: str) -> None:
        self.model = model
        self.layout = layout
        self.shape = MoEShape(model.hidden_size, model.intermediate_size,
                              model.num_experts_per_token, model.num_experts)
        self.dtype = _dtype_key(weight_dtype, model)
        self._tables = tables
        self._curve, self._floor, self._scale, self.source = self._measured()
        if self._curve is None:
            gemm_dtype = "fp8" if weight_dtype == "fp8" and tables.has_gemm("fp8") else "bfloat16"
            self._gemm_dtype = gemm_dtype
            width = model.intermediate_size / layout.moe_tp
            h = float(model.hidden_size)
            self._gate_up = tables.gemm_curve(gemm_dtype, 2 * width, h)
            self._down = tables.gemm_curve(gemm_dtype, h, width)
            efficiency, measured_on = grouped_gemm_efficiency(tables.system, gemm_dtype)
            self._estimate = self._estimate_curve(efficiency)
            self.source = (f"estimate: touched experts × dense {gemm_dtype} GEMM tables × "
                           f"grouped-GEMM efficiency from {measured_on}'s measured fused-MoE "
                           "shapes")
        self._comm = _EPComm(tables, layout, model)

    # -- expert compute -------------------------------------------------------------------------
    def _measured(self) -> tuple[Curve | None, float, float, str]:
        """(curve, floor µs, scale above the floor, source) of the measured table to use."""
        lay, tables = self.layout, self._tables
        layouts = tables.moe_layouts(self.dtype, self.shape)
        want = (lay.moe_tp, lay.ep_size)
        if want in layouts:
            curve = tables.moe_curve(self.dtype, self.shape, *want)
            assert curve is not None
            return curve, 0.0, 1.0, (f"measured fused MoE ({self.dtype}, MoE TP {want[0]} EP "
                                     f"{want[1]}, {tables.system})")
        # beyond the measured sizes: the largest measured one along the same axis, scaled
        along = [p for p in layouts if (p[1] == 1 if lay.ep_size == 1 else p[0] == 1)]
        size = lay.moe_tp if lay.ep_size == 1 else lay.ep_size
        larger = [p for p in along if max(p) < size]
        if not larger:
            return None, 0.0, 1.0, ""
        ref = max(larger, key=max)
        curve = tables.moe_curve(self.dtype, self.shape, *ref)
        assert curve is not None
        return curve, min(curve.ys), max(ref) / size, (
            f"measured fused MoE ({self.dtype}, MoE TP {ref[0]} EP {ref[1]}) scaled by "
            f"{max(ref)}/{size} (estimate)")

    def routed_tokens(self, num_tokens: int) -> float:
        """Tokens whose expert rows this rank computes: every DP rank's (DP × its own)."""
        return float(num_tokens * self.layout.data_parallel_size)

    def experts_s(self, num_tokens: int) -> float:
        """The fused-experts kernel of one layer for ``num_tokens`` tokens of this rank."""
        tokens = self.routed_tokens(num_tokens)
        if tokens <= 0:
            return 0.0
        if self._curve is not None:
            t = self._curve.at(tokens)
            return (self._floor + (t - self._floor) * self._scale) * 1e-6
        return self._estimate.at(tokens) * 1e-6

    def _estimate_curve(self, efficiency: Curve) -> Curve:
        """The dense-GEMM estimate × grouped-GEMM efficiency on a token grid, made
        non-decreasing in the tokens (more rows never take less time)."""
        ys: list[float] = []
        for t in ESTIMATE_TOKENS:
            y = self.estimate_us(float(t)) * efficiency.at(float(t))
            ys.append(max(y, ys[-1]) if ys else y)
        return Curve([float(t) for t in ESTIMATE_TOKENS], ys)

    def estimate_us(self, tokens: float) -> float:
        """Dense-GEMM estimate (µs) of the experts of ``tokens`` routed tokens."""
        m = self.model
        return dense_estimate_us(self._gate_up, self._down, m.num_experts,
                                 m.num_experts_per_token, self.layout.ep_size, tokens)

    def touched_local_experts(self, num_tokens: int) -> float:
        """Expected experts of this rank a step of ``num_tokens`` tokens touches."""
        m = self.model
        tokens = self.routed_tokens(num_tokens)
        return touched_experts(m.num_experts, m.num_experts_per_token, tokens) / (
            self.layout.ep_size)

    def dispatch_s(self, num_tokens: int) -> float:
        """EP dispatch + combine of one layer (0 without EP or with DP 1)."""
        return self._comm.dispatch_combine_s(num_tokens)

    @property
    def comm_source(self) -> str:
        return self._comm.source


def dense_estimate_us(gate_up: Curve, down: Curve, num_experts: int, top_k: int, ep_size: int,
                      tokens: float) -> float:
    """Each touched expert of one rank runs gate+up and down (dense GEMM curves, µs) on its
    share of the rows: ``touched`` experts of ``num_experts / ep_size``, ``tokens·k/ep_size``
    rows in all."""
    touched = touched_experts(num_experts, top_k, tokens) / ep_size
    touched = max(min(touched, num_experts / ep_size), 1.0)
    rows = tokens * top_k / ep_size / touched
    return touched * (gate_up.at(rows) + down.at(rows))


class _EPComm:
    """Dispatch and combine of a MoE layer over the DP ranks (seconds)."""

    def __init__(self, tables: KernelTables, layout: MoELayout, model: ModelSpec) -> None:
        self.layout = layout
        self.hidden_bytes = 2.0 * model.hidden_size  # bf16 hidden state of one token
        self.top_k = model.num_experts_per_token
        self.source = "no dispatch (DP 1: tokens on every rank; combine = all-reduce)"
        self._curves: tuple[Curve, ...] = ()
        dp, world = layout.data_parallel_size, layout.world
        if dp == 1:
            return
        measured = min(world, 8)  # NCCL tables cover one 8-GPU node
        if layout.all2all_backend == "alltoall" and layout.expert_parallel:
            ops = ("alltoall", "alltoall")
        else:
            ops = ("all_gather", "reduce_scatter")
        curves = [tables.collective_curve(op, measured) for op in ops]
        if any(c is None for c in curves):
            raise ConfigError(f"no measured NCCL {'/'.join(ops)} at {measured} GPUs on "
                              f"{tables.system} for expert-parallel dispatch")
        self._curves = tuple(c for c in curves if c is not None)
        beyond = f" (curves of {measured} GPUs)" if world > measured else ""
        backend = layout.all2all_backend if layout.expert_parallel else "allgather_reducescatter"
        self.source = f"NCCL {ops[0]} + {ops[1]} over {world} ranks, {backend}{beyond}"

    def dispatch_combine_s(self, num_tokens: int) -> float:
        if not self._curves or num_tokens <= 0:
            return 0.0
        lay = self.layout
        if lay.all2all_backend == "alltoall" and lay.expert_parallel:
            copies = min(self.top_k, lay.ep_size)
            nbytes = num_tokens * copies * self.hidden_bytes
        else:
            nbytes = num_tokens * lay.data_parallel_size * self.hidden_bytes
        return sum(c.at(nbytes) for c in self._curves) * 1e-6


#: Where a GPU without measured fused-MoE shapes takes its grouped-GEMM efficiency from.
EFFICIENCY_FALLBACK = "h100_sxm"


@cache
def grouped_gemm_efficiency(system: str, gemm_dtype: str) -> tuple[Curve, str]:
    """(measured fused-MoE time ÷ the dense-GEMM estimate by token count, the GPU it was
    measured on): the median over the GPU's measured shapes at MoE TP 1, EP 1; a GPU without
    any (A100: only skewed-routing rows) takes the H100's."""
    tables = load_tables(system)
    table_dtype = "fp8" if gemm_dtype == "fp8" else "bfloat16"
    ratios: dict[int, list[float]] = {t: [] for t in EFFICIENCY_TOKENS}
    for shape in tables.moe_shapes(table_dtype):
        measured = tables.moe_curve(table_dtype, shape, 1, 1)
        if measured is None:
            continue
        gate_up = tables.gemm_curve(gemm_dtype, 2.0 * shape.inter, float(shape.hidden))
        down = tables.gemm_curve(gemm_dtype, float(shape.hidden), float(shape.inter))
        for t in EFFICIENCY_TOKENS:
            if measured.xs[0] <= t <= measured.xs[-1]:
                est = dense_estimate_us(gate_up, down, shape.experts, shape.topk, 1, float(t))
                ratios[t].append(measured.at(t) / est)
    xs = [float(t) for t in EFFICIENCY_TOKENS if ratios[t]]
    if not xs:
        if system == EFFICIENCY_FALLBACK:
            raise ConfigError(f"no measured fused-MoE shapes on {system}")
        return grouped_gemm_efficiency(EFFICIENCY_FALLBACK, gemm_dtype)
    return Curve(xs, [statistics.median(ratios[int(x)]) for x in xs]), system
