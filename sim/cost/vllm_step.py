"""vLLM 0.33's step, kernel by kernel: the default cost model for GPUs with measured tables.

A step of ``T`` scheduled tokens runs on the GPU as vLLM runs it (``sim/cost/cuda_graphs.py``):
a uniform decode batch replays a FULL CUDA graph padded to the next captured size; other
batches up to the largest captured size replay PIECEWISE graphs (dense parts padded, attention
and the KV-cache update eager on the real rows); larger batches, or ``--enforce-eager``, run
EAGER. Its device time is the sum of its kernels (``TERM_NAMES``; per layer × layers, plus the
per-step ones), each from measured vLLM kernel tables (``sim/cost/kernel_tables.py``) or the
fitted element-wise model (``sim/cost/elementwise.py``):

* ``gemm.qkv`` / ``gemm.o`` / ``gemm.gate_up`` / ``gemm.down`` — the layer's four GEMMs on the
  padded token count, bf16 or fp8 (W8A8) tables: tile and wave steps are in the data;
* ``attention.decode`` / ``attention.prefill`` — the decodes' and the prefill chunks'
  attention (``sim/cost/attention.py``: GQA with full or sliding-window layers, or DeepSeek's
  MLA — its measured attention module, projections included, where the GPU has it);
* ``kv_cache_write``, ``norm.add_rmsnorm`` (2 per layer; fused into the all-reduce at TP > 1 on
  Hopper/Blackwell), ``rotary``, ``silu_and_mul``, ``embedding``, ``norm.final`` — bytes moved
  over the fitted element-wise bandwidth;
* ``allreduce`` — 2 per layer + 1 (embedding) at TP > 1, measured by size, graph or eager;
* ``lm_head``, ``logits_gather`` (TP > 1), ``sampler`` — on the rows that sample.
* mixture-of-experts layers (``sim/cost/moe.py``): ``moe.router`` (the gate GEMM),
  ``moe.experts`` (the fused-experts kernel: measured tables by shape and MoE TP/EP, or the
  touched experts' dense GEMMs × the measured grouped-GEMM efficiency), ``moe.shared_experts``
  (DeepSeek's and Qwen2-MoE's always-on experts), ``moe.dispatch`` (expert-parallel
  dispatch/combine over the DP ranks); ``gemm.gate_up``/``gemm.down`` then price only the
  dense layers (DeepSeek's first ones).

The host side (``sim/cost/host.py``): ``StepTime.host_s`` is the worker's input preparation
before the first kernel, ``StepTime.launch_s`` the time to launch the step; the device cannot
finish before its launches (``launch_bound`` term: the excess of launching over the kernels).
The replica charges both on the engine's CPU timeline, where async scheduling overlaps them with
the previous step's device time.

Per-token-count parts are memoised, so a step costs a few dictionary lookups and one or two
attention interpolations; ``decode_step_total`` is the bulk fast path's shortcut, bit-identical
to ``step_time(...).total_s`` of the same decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from engine.core.config import ConfigError
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.cost.attention import AttentionCost, mla_projection_shapes
from sim.cost.comm import TensorParallelComm, fused_norm_max_bytes
from sim.cost.cuda_graphs import (
    EAGER,
    FULL,
    MODE_NAMES,
    CudaGraphConfig,
    CudaGraphPlan,
)
from sim.cost.elementwise import fit_for
from sim.cost.host import HostCosts, launch_s
from sim.cost.interp import Curve
from sim.cost.kernel_tables import KernelTables, load_tables
from sim.cost.moe import MoECost, MoELayout
from sim.hardware import GPUSpec
from sim.models import ModelSpec, check_tensor_parallel

#: Every term of a step's breakdown, in this order (``StepTime.terms`` uses these names).
TERM_NAMES: Final = (
    "gemm.qkv",
    "gemm.o",
    "gemm.gate_up",
    "gemm.down",
    "moe.router",
    "moe.experts",
    "moe.shared_experts",
    "moe.dispatch",
    "attention.decode",
    "attention.prefill",
    "kv_cache_write",
    "norm.add_rmsnorm",
    "rotary",
    "silu_and_mul",
    "allreduce",
    "embedding",
    "norm.final",
    "lm_head",
    "logits_gather",
    "sampler",
    "launch_bound",
)
#: The breakdown's groups (``StepTime.linear_s`` etc.) by term.
LINEAR_TERMS: Final = frozenset(
    {"gemm.qkv", "gemm.o", "gemm.gate_up", "gemm.down", "moe.router", "moe.experts",
     "moe.shared_experts", "lm_head"}
)
ATTENTION_TERMS: Final = frozenset({"attention.decode", "attention.prefill"})
COMM_TERMS: Final = frozenset({"allreduce", "logits_gather", "moe.dispatch"})

ACTIVATION_BYTES: Final = 2  # bf16 activations
WEIGHT_DTYPES: Final = ("bfloat16", "fp8")
KV_CACHE_DTYPES: Final = ("bfloat16", "fp8")
#: Bytes of fp32 logits work per sampled row and vocabulary entry: cast to fp32 (2 in, 4 out),
#: softmax (4 in, 4 out), top-k/top-p sampling (two passes over the probabilities, 8).
SAMPLER_BYTES_PER_LOGIT: Final = 22.0
SAMPLER_PASSES: Final = 3


@dataclass(frozen=True, slots=True)
class TermDetail:
    """One line of a step's explanation."""

    name: str
    seconds: float
    detail: str  # count, shape and source of the number


@dataclass(frozen=True, slots=True)
class StepExplanation:
    """A step's cost by term, with the graph mode and padding vLLM would use."""

    mode: str  # "full", "piecewise" or "eager"
    num_tokens: int
    padded_tokens: int
    terms: tuple[TermDetail, ...]
    kernels_s: float
    launch_s: float
    host_s: float
    total_s: float


class _Dense:
    """The memoised token-count-dependent part of a step (seconds)."""

    __slots__ = ("comm_s", "kernels_s", "launch_s", "linear_s", "mode", "padded", "terms")

    def __init__(self, mode: int, padded: int, terms: tuple[tuple[str, float], ...],
                 launch: float) -> None:
        self.mode = mode
        self.padded = padded
        self.terms = terms
        self.launch_s = launch
        kernels = linear = comm = 0.0
        for name, value in terms:
            kernels += value
            if name in LINEAR_TERMS:
                linear += value
            elif name in COMM_TERMS:
                comm += value
        self.kernels_s = kernels
        self.linear_s = linear
        self.comm_s = comm


class _Head:
    """The memoised sampling-row-dependent part (LM head, logits gather, sampler)."""

    __slots__ = ("comm_s", "linear_s", "terms", "total_s")

    def __init__(self, lm_head: float, gather: float, sampler: float) -> None:
        self.terms = (("lm_head", lm_head), ("logits_gather", gather), ("sampler", sampler))
        self.total_s = lm_head + gather + sampler
        self.linear_s = lm_head
        self.comm_s = gather


class VllmStepCostModel:
    """``CostModel`` pricing every kernel of a vLLM 0.33 step from measured tables."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tensor_parallel_size: int = 1,
        *,
        weight_dtype: str = "bfloat16",
        kv_cache_dtype: str = "bfloat16",
        graphs: CudaGraphPlan | None = None,
        host: HostCosts | None = None,
        data_parallel_size: int = 1,
        expert_parallel: bool = False,
        all2all_backend: str = "allgather_reducescatter",
    ) -> None:
        tp = tensor_parallel_size
        check_tensor_parallel(model, tp)
        if weight_dtype not in WEIGHT_DTYPES:
            raise ConfigError(f"weight dtype must be one of {WEIGHT_DTYPES}, got {weight_dtype!r}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"KV-cache dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
            )
        if weight_dtype == "fp8" and gpu.fp8_tflops is None:
            raise ConfigError(
                f"--quantization fp8 needs fp8 tensor cores; {gpu.display_name} has none"
            )
        if gpu.kernel_tables is None:
            raise ConfigError(
                f"no measured kernel tables for {gpu.name}: use --cost-model roofline"
            )
        self.model = model
        self.gpu = gpu
        self.tensor_parallel_size = tp
        self.weight_dtype = weight_dtype
        self.kv_cache_dtype = kv_cache_dtype
        self.graphs = graphs if graphs is not None else CudaGraphPlan.for_engine(
            CudaGraphConfig(), 1024, 8192, gpu.sm_version
        )
        self.host = host if host is not None else HostCosts()
        tables = load_tables(gpu.kernel_tables)
        self.tables = tables
        self._layers = model.num_layers
        self._hq = model.num_heads // tp
        self._hk = max(model.num_kv_heads // tp, 1)
        self._dense_layers = model.num_layers - model.num_moe_layers
        dense_width = model.dense_intermediate_size if model.is_moe else model.intermediate_size
        self._ff = dense_width // tp
        self.moe_layout = MoELayout(tp, data_parallel_size, expert_parallel, all2all_backend)
        if model.is_mla:  # the latent (+ shared rope key) per token; rope on q's rope part and k
            self._kv_elems = model.kv_lora_rank + model.qk_rope_head_dim
            self._rope_elems = (self._hq + 1) * model.qk_rope_head_dim
        else:
            self._kv_elems = 2 * self._hk * model.head_dim
            self._rope_elems = (self._hq + self._hk) * model.head_dim
        self.attention = AttentionCost(model, tables, tp, kv_cache_dtype, weight_dtype)
        self._set_up_gemms(tables)
        self.comm = TensorParallelComm(tables, tp)
        self._fused_norm_bytes = fused_norm_max_bytes(gpu.sm_version, tp)
        ew = fit_for(gpu.name)
        self._ew_bw = gpu.memory_bw_bytes_s * ew.bw_efficiency
        self._ew_floor = ew.floor_s
        self.elementwise_source = ew.source
        self._kv_elem_bytes = 1 if kv_cache_dtype == "fp8" else 2
        self._host_launch = tuple(launch_s(self.host, mode, self._layers, tp) for mode in range(3))
        self._dense_decode: dict[int, _Dense] = {}
        self._dense_mixed: dict[int, _Dense] = {}
        self._head: dict[int, _Head] = {}

    # -- set-up ---------------------------------------------------------------------------------
    def _set_up_gemms(self, tables: KernelTables) -> None:
        """The GEMM curves of one layer: attention projections (GQA's QKV and O, or MLA's
        projections unless its measured module prices them), the dense MLP, the MoE layer."""
        m, d, h = self.model, self.model.head_dim, self.model.hidden_size
        w = self.weight_dtype
        if not tables.has_gemm(w):
            raise ConfigError(f"no measured {w} GEMMs for {self.gpu.name}")
        tp = self.tensor_parallel_size
        shapes: dict[str, list[tuple[float, float]]] = {}
        if m.is_mla:
            if not self.attention.mla_module:
                shapes.update(mla_projection_shapes(m, tp))
        else:
            shapes["gemm.qkv"] = [(float((self._hq + 2 * self._hk) * d), float(h))]
            shapes["gemm.o"] = [(float(h), float(self._hq * d))]
        if self._dense_layers:
            shapes["gemm.gate_up"] = [(float(2 * self._ff), float(h))]
            shapes["gemm.down"] = [(float(h), float(self._ff))]
        self._gemm_shapes = shapes
        self._gemm: dict[str, list[Curve]] = {
            name: [tables.gemm_curve(w, n, k) for n, k in nk] for name, nk in shapes.items()
        }
        self._moe = m.is_moe
        if self._moe:
            self._router = tables.gemm_curve("bfloat16", float(m.num_experts), float(h))
            self.moe = MoECost(m, tables, self.moe_layout, w)
            shared = m.shared_expert_intermediate_size / tp
            self._shared = [tables.gemm_curve(w, 2 * shared, float(h)),
                            tables.gemm_curve(w, float(h), shared)] if shared else []
        self._lm_head = tables.gemm_curve("bfloat16", m.vocab_size / tp, float(h))

    # -- kernels --------------------------------------------------------------------------------
    def _elementwise(self, nbytes: float) -> float:
        return nbytes / self._ew_bw + self._ew_floor

    def _gemm_s(self, name: str, tokens: float) -> float:
        curves = self._gemm.get(name)
        if curves is None:
            return 0.0
        return sum(c.at(tokens) for c in curves) * 1e-6

    def _moe_terms(self, tokens: int, padded: float) -> list[tuple[str, float]]:
        """The MoE layers' terms: router and shared experts on the padded rows (inside the
        graph), the fused experts and the dispatch on the real tokens."""
        layers = self.model.num_moe_layers
        shared = sum(c.at(padded) for c in self._shared) * 1e-6
        return [
            ("moe.router", layers * self._router.at(padded) * 1e-6),
            ("moe.experts", layers * self.moe.experts_s(tokens)),
            ("moe.shared_experts", layers * shared),
            ("moe.dispatch", layers * self.moe.dispatch_s(tokens)),
        ]

    def _dense(self, num_tokens: int, uniform_decode: bool) -> _Dense:
        """The step's token-count-dependent kernels (all layers), memoised."""
        memo = self._dense_decode if uniform_decode else self._dense_mixed
        got = memo.get(num_tokens)
        if got is not None:
            return got
        mode, padded = self.graphs.dispatch(num_tokens, uniform_decode)
        L, h, a = self._layers, self.model.hidden_size, ACTIVATION_BYTES
        tp = float(padded)
        ew = self._elementwise
        dense = self._dense_layers
        terms: list[tuple[str, float]] = [
            ("gemm.qkv", L * self._gemm_s("gemm.qkv", tp)),
            ("gemm.o", L * self._gemm_s("gemm.o", tp)),
            ("gemm.gate_up", dense * self._gemm_s("gemm.gate_up", tp)),
            ("gemm.down", dense * self._gemm_s("gemm.down", tp)),
        ]
        shared_act = 0.0
        if self._moe:
            terms += self._moe_terms(padded, tp)
            if self._shared:  # the shared experts' SiLU-and-mul (routed ones: in the kernel)
                width = self.model.shared_expert_intermediate_size / self.tensor_parallel_size
                shared_act = self.model.num_moe_layers * ew(3 * tp * width * a)
        # the KV-cache update runs in the FULL graph on the padded rows, eagerly on the real ones
        kv_rows = tp if mode == FULL else float(num_tokens)
        kv_write = ew(kv_rows * self._kv_elems * (a + self._kv_elem_bytes))
        message = tp * h * a
        tp_size = self.tensor_parallel_size
        num_norms = 2 * L
        allreduce = 0.0
        if tp_size > 1:
            graph = mode != EAGER
            allreduce = (2 * L + 1) * self.comm.allreduce_s(message, graph)
            if message <= self._fused_norm_bytes:
                num_norms = 1  # the others run inside the fused all-reduce + RMSNorm
        final_norm = 0.0 if tp_size > 1 and message <= self._fused_norm_bytes else ew(
            4 * tp * h * a
        )
        terms += [
            ("kv_cache_write", L * kv_write),
            ("norm.add_rmsnorm", num_norms * ew(4 * tp * h * a)),
            ("rotary", L * ew(2 * tp * self._rope_elems * a)),
            ("silu_and_mul", dense * ew(3 * tp * self._ff * a) + shared_act),
            ("allreduce", allreduce),
            ("embedding", ew(2 * tp * h * a)),
            ("norm.final", final_norm),
        ]
        got = _Dense(mode, padded, tuple(terms), self._host_launch[mode])
        memo[num_tokens] = got
        return got

    def _head_part(self, rows: int) -> _Head:
        got = self._head.get(rows)
        if got is not None:
            return got
        if rows == 0:
            got = _Head(0.0, 0.0, 0.0)
        else:
            vocab = self.model.vocab_size
            lm_head = self._lm_head.at(float(rows)) * 1e-6
            gather = self.comm.allgather_s(rows * vocab * ACTIVATION_BYTES)
            sampler = rows * vocab * SAMPLER_BYTES_PER_LOGIT / self._ew_bw + (
                SAMPLER_PASSES * self._ew_floor
            )
            got = _Head(lm_head, gather, sampler)
        self._head[rows] = got
        return got

    # -- the protocol ---------------------------------------------------------------------------
    def step_time(self, shape: BatchShape) -> StepTime:
        n = shape.num_tokens
        if n == 0:
            return StepTime(total_s=0.0)
        uniform = shape.num_prefill_reqs == 0
        dense = self._dense(n, uniform)
        head = self._head_part(shape.num_sampling_reqs)
        decode = 0.0
        if shape.num_decode_reqs:
            decode = self.attention.decode_s(
                shape.num_decode_reqs, shape.decode_context_sum, shape.decode_context_max
            )
        if uniform:
            attention = decode
            prefill = 0.0
        else:
            prefill = self.attention.prefill_s(shape)
            attention = prefill + decode
            if shape.num_decode_reqs:
                attention -= self._layers * self.attention.floor_us * 1e-6
        kernels = dense.kernels_s + attention + head.total_s
        launch = dense.launch_s
        total = kernels if kernels > launch else launch
        terms = dense.terms + head.terms + (
            ("attention.decode", decode),
            ("attention.prefill", attention - decode),
            ("launch_bound", total - kernels),
        )
        linear = dense.linear_s + head.linear_s
        comm = dense.comm_s + head.comm_s
        host = self.host.prepare_s + self.host.prepare_s_per_request * shape.num_reqs
        return StepTime(
            total_s=total,
            linear_s=linear,
            attention_s=attention,
            communication_s=comm,
            overhead_s=total - linear - attention - comm,
            host_s=host,
            launch_s=launch,
            terms=terms,
        )

    def decode_step_total(self, num_reqs: int, context_sum: int, context_max: int) -> float:
        """``step_time(...).total_s`` of a pure-decode step of ``num_reqs`` requests whose
        cached contexts sum to ``context_sum`` (longest ``context_max``): the same operations in
        the same order, so the value is bit-identical (the bulk decode runs rely on it)."""
        dense = self._dense_decode.get(num_reqs)
        if dense is None:
            dense = self._dense(num_reqs, True)
        head = self._head.get(num_reqs)
        if head is None:
            head = self._head_part(num_reqs)
        attention = self.attention.decode_s(num_reqs, context_sum, context_max)
        kernels = dense.kernels_s + attention + head.total_s
        launch = dense.launch_s
        return kernels if kernels > launch else launch

    def decode_step_host(self, num_reqs: int) -> tuple[float, float]:
        """(``host_s``, ``launch_s``) of a pure-decode step of ``num_reqs`` requests."""
        dense = self._dense_decode.get(num_reqs)
        if dense is None:
            dense = self._dense(num_reqs, True)
        return self.host.prepare_s + self.host.prepare_s_per_request * num_reqs, dense.launch_s

    # -- explanation ----------------------------------------------------------------------------
    def explain(self, shape: BatchShape) -> StepExplanation:
        """``step_time`` with the graph mode, padding and each term's shape and source."""
        st = self.step_time(shape)
        n = shape.num_tokens
        uniform = shape.num_prefill_reqs == 0
        mode, padded = self.graphs.dispatch(n, uniform) if n else (EAGER, 0)
        details = self._details(padded, mode, shape)
        ordered = sorted(st.terms, key=lambda t: TERM_NAMES.index(t[0]))
        terms = tuple(TermDetail(name, s, details.get(name, "")) for name, s in ordered)
        kernels = sum(s for name, s in st.terms if name != "launch_bound")
        return StepExplanation(MODE_NAMES[mode], n, padded, terms, kernels, st.launch_s,
                               st.host_s, st.total_s)

    def _details(self, padded: int, mode: int, shape: BatchShape) -> dict[str, str]:
        L = self._layers
        sys_ = self.tables.system
        src = self.tables.sources
        out: dict[str, str] = {}
        gemm_src = src.get(("gemm", self.weight_dtype))
        version = f"vLLM {gemm_src.version} " if gemm_src is not None else ""
        m = self.model
        for name, shapes in self._gemm_shapes.items():
            count = self._dense_layers if name in ("gemm.gate_up", "gemm.down") else L
            dims = " + ".join(f"n={n:g} k={k:g}" for n, k in shapes)
            out[name] = (f"{count} × {self.weight_dtype} GEMM m={padded} {dims} "
                         f"({version}{sys_} table)")
        if m.is_mla and self.attention.mla_module:
            out["gemm.qkv"] = out["gemm.o"] = "in the measured MLA module (attention terms)"
        if self._moe:
            e, lm = m.num_experts, m.num_moe_layers
            out["moe.router"] = f"{lm} × bf16 GEMM m={padded} n={e} k={m.hidden_size}"
            touched = self.moe.touched_local_experts(padded)
            out["moe.experts"] = (
                f"{lm} × top-{m.num_experts_per_token} of {e} experts, {touched:.1f} of "
                f"{e / self.moe_layout.ep_size:g} local experts touched; {self.moe.source}")
            if self._shared:
                out["moe.shared_experts"] = (f"{lm} × dense GEMMs, width "
                                             f"{m.shared_expert_intermediate_size}")
            out["moe.dispatch"] = f"{lm} × {self.moe.comm_source}"
        dec = self.tables.sources.get(("attn_decode", self.kv_cache_dtype))
        kernel = f", {dec.kernel} vLLM {dec.version}" if dec is not None else ""
        mean = shape.decode_context_sum / max(shape.num_decode_reqs, 1)
        out["attention.decode"] = (f"{L} × {shape.num_decode_reqs} decodes at mean context "
                                   f"{mean:.0f}; {self.attention.decode_source}{kernel}")
        out["attention.prefill"] = (f"{L} × {shape.num_prefill_reqs} chunks "
                                    f"({sum(shape.prefill_query_lens)} tokens); "
                                    f"{self.attention.prefill_source}")
        ew = (f"bytes / ({self._ew_bw / self.gpu.memory_bw_bytes_s:.3f} × "
              f"{self.gpu.memory_bw_tbps:g} TB/s) + {self._ew_floor * 1e6:.2f} µs")
        for name in ("kv_cache_write", "rotary", "silu_and_mul"):
            out[name] = f"{L} × {ew}"
        out["norm.add_rmsnorm"] = f"fused add + RMSNorm, {ew} ({self.elementwise_source})"
        out["embedding"] = out["norm.final"] = f"1 × {ew}"
        if self.tensor_parallel_size > 1:
            kind = "eager" if mode == EAGER else "graph"
            out["allreduce"] = (f"{2 * L + 1} × {padded * self.model.hidden_size * 2} B, {kind}; "
                                f"{self.comm.source}")
            out["logits_gather"] = "NCCL all-gather of the logits (measured)"
        out["lm_head"] = (f"bf16 GEMM m={shape.num_sampling_reqs} "
                          f"n={self.model.vocab_size / self.tensor_parallel_size:g} "
                          f"k={self.model.hidden_size}")
        out["sampler"] = f"{shape.num_sampling_reqs} rows × {self.model.vocab_size} logits, {ew}"
        out["launch_bound"] = (f"host launches ({MODE_NAMES[mode]}) "
                               f"{self._host_launch[mode] * 1e6:.0f} µs vs kernels")
        return out
