"""Collective communication of a tensor-parallel vLLM step, from measured times.

vLLM 0.33 reduces a row-parallel layer's output with ``tensor_model_parallel_all_reduce``,
which picks its implementation by message size and TP degree (FlashInfer's all-reduce, vLLM's
custom one-shot / two-shot kernels, torch symmetric memory, NCCL for the largest). The shipped
tables measure that call as a whole (aiconfigurator, vLLM 0.24 kernels) by message bytes, TP
degree and whether it ran inside a CUDA graph (``vllm_graph``) or eagerly (``vllm_eager``, which
adds the host launch and synchronisation), so vLLM's own size-based choice is in the data.

On Hopper and data-centre Blackwell with TP > 1, vLLM's ``-O2`` fuses the all-reduce with the
following residual add and RMSNorm (FlashInfer ``allreduce_fusion``) for messages up to
``fused_norm_max_bytes``: the norm is then no kernel of its own (vLLM 0.33:
``vllm/config/vllm.py`` ``enable_allreduce_rms_fusion``; limits in
``compilation/passes/fusion/allreduce_rms_fusion.py``).

The logits of a TP > 1 step are gathered (``LogitsProcessor``: all-gather on CUDA), priced with
the NCCL all-gather table.
"""

from __future__ import annotations

from sim.cost.interp import Curve
from sim.cost.kernel_tables import KernelTables

#: vLLM 0.33 ``FI_ALLREDUCE_FUSION_MAX_SIZE_MB`` by compute capability family and TP degree.
_FUSION_MAX_MB: dict[int, dict[int, float]] = {
    9: {2: 64.0, 4: 2.0, 8: 0.5},
    10: {2: 64.0, 4: 32.0, 8: 1.0},
}


def fused_norm_max_bytes(sm_version: int, tp: int) -> float:
    """Largest all-reduce message vLLM fuses with the next add + RMSNorm (0: never)."""
    if tp < 2:
        return 0.0
    return _FUSION_MAX_MB.get(sm_version // 10, {}).get(tp, 0.0) * 2**20


class TensorParallelComm:
    """All-reduce and all-gather times (seconds) of one GPU type at one TP degree."""

    tp: int
    _graph: Curve | None
    _eager: Curve | None
    _gather: Curve | None
    source: str

    def __init__(self, tables: KernelTables, tp: int) -> None:
        self.tp = tp
        self._graph = self._eager = self._gather = None
        self.source = "no communication (TP 1)"
        if tp > 1:
            self._graph = tables.allreduce_curve(tp, graph=True)
            self._eager = tables.allreduce_curve(tp, graph=False)
            self._gather = tables.collective_curve("all_gather", tp)
            src = tables.sources.get(("allreduce", "bfloat16"))
            version = f" vLLM {src.version}" if src is not None else ""
            self.source = f"measured vLLM all-reduce{version}, TP {tp} ({tables.system})"

    def allreduce_s(self, nbytes: float, graph: bool) -> float:
        """One ``tensor_model_parallel_all_reduce`` of ``nbytes``, in a graph or eager."""
        curve = self._graph if graph else self._eager
        if curve is None or nbytes <= 0.0:
            return 0.0
        return curve.at(nbytes) * 1e-6

    def allgather_s(self, nbytes: float) -> float:
        """One all-gather whose gathered result is ``nbytes`` (0 without measurements)."""
        if self._gather is None or nbytes <= 0.0:
            return 0.0
        return self._gather.at(nbytes) * 1e-6
