"""Analytic roofline cost model: how long one engine step takes on a catalogued GPU layout.

For every kernel of a step the model takes ``max(FLOPs / achievable FLOP/s, bytes / achievable
bandwidth) + kernel floor`` (docs/roofline.md §1):

* linear layers — QKV, O, gate+up, down per layer, each its own GEMM over all ``T`` scheduled
  tokens with ``1/tp`` of the weights: small ``T`` is weight-read bound (decode), large ``T`` is
  compute bound (prefill); the crossover is where a batch turns compute bound;
* attention — one launch per layer over the batch: prefill chunks ``(q, ctx)`` cost
  ``4·H/tp·d·q·(ctx + (q+1)/2)`` FLOPs and read their KV; decodes read ``ctx + 1`` tokens of KV;
* LM head — only for the rows that sample this step;
* mixture of experts — the experts a batch touches (``sim/cost/moe.py``) read their weights
  and run their rows; MoE layers are sharded over TP × DP (whole experts under expert
  parallelism, slices otherwise) and with DP > 1 the DP ranks' tokens come to every rank (a
  ring all-gather and reduce-scatter of their hidden states);
* MLA — the projections as GEMMs and attention over the latent cache (``ModelSpec``'s KV
  bytes); sliding-window layers attend to at most the window;
* tensor parallelism — two ring all-reduces of ``T·hidden`` activations per layer;
* fixed overheads — per step (launch/graph replay, sampling set-up) and per scheduled request.

Every efficiency and overhead is a named parameter (``RooflineParams``); GPU efficiencies come
from the catalog (``sim/hardware.py``), calibrated on measured operator times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.core.config import ConfigError
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.cost.attention import mla_projection_shapes
from sim.cost.moe import touched_experts
from sim.hardware import GPUSpec
from sim.models import ModelSpec, check_tensor_parallel


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """Knobs of the roofline beyond the GPU catalog's efficiencies (seconds unless stated).

    Defaults: ``kernel_floor_s`` is the shortest time a GEMM kernel takes however small its
    input (fitted with the efficiencies, see docs/roofline.md); ``step_overhead_s`` covers a
    step's launch/graph replay and sampler set-up on the GPU side; ``per_request_overhead_s``
    per-sequence work that scales with the batch (sampling, metadata). Both overheads are
    estimates from vLLM's published V1 profiles on H100 (decode steps spend ≈0.3–0.6 ms outside
    the model's kernels at small batch), not fitted to any validation run.
    """

    kernel_floor_s: float = 8.4e-6
    step_overhead_s: float = 4e-4
    per_request_overhead_s: float = 2e-6
    attention_compute_efficiency: float = 0.5  # fraction of the GEMM efficiency attention reaches
    activation_bytes: int = 2  # bf16 activations

    def __post_init__(self) -> None:
        for name in ("kernel_floor_s", "step_overhead_s", "per_request_overhead_s"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.activation_bytes < 1:
            raise ConfigError(f"activation_bytes must be >= 1, got {self.activation_bytes}")
        if not 1e-3 <= self.attention_compute_efficiency <= 1:
            raise ConfigError(
                "attention_compute_efficiency must be in [0.001, 1], got "
                f"{self.attention_compute_efficiency}"
            )


def ring_allreduce_s(
    nbytes: float, world_size: int, link_bw_bytes_s: float, efficiency: float, latency_s: float
) -> float:
    """A ring all-reduce of ``nbytes`` per GPU over ``world_size`` GPUs:
    ``2(t-1)/t · bytes / (link bandwidth · ε) + L`` (public: the calibration fits ε and L)."""
    t = world_size
    return 2.0 * (t - 1) / t * nbytes / (link_bw_bytes_s * efficiency) + latency_s


class RooflineCostModel:
    """``CostModel`` for one model on ``tensor_parallel_size`` GPUs of one kind."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tensor_parallel_size: int = 1,
        params: RooflineParams | None = None,
        *,
        expert_parallel: bool = False,
        data_parallel_size: int = 1,
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.params = params or RooflineParams()
        self.tensor_parallel_size = tp = tensor_parallel_size
        check_tensor_parallel(model, tp)
        m, w = model, model.linear_bytes
        # fp8 (1-byte) linear weights run W8A8 GEMMs at the fp8 peak
        peak = gpu.fp8_tflops * 1e12 if w == 1 and gpu.fp8_tflops else gpu.peak_flops
        self._flops_s = peak * gpu.compute_efficiency
        self._attn_flops_s = (  # attention stays 16-bit
            gpu.peak_flops * gpu.compute_efficiency * self.params.attention_compute_efficiency
        )
        self._bw = gpu.memory_bw_bytes_s * gpu.memory_efficiency
        hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
        h = m.hidden_size
        f = m.dense_intermediate_size if m.is_moe else m.intermediate_size
        # (in_features, out_features) of each GEMM of a layer, per TP rank.
        self._gemms: tuple[tuple[float, float], ...] = (
            (h, (hq + 2 * hkv) * d / tp),  # QKV
            (hq * d / tp, h),  # O
            (h, 2 * f / tp),  # gate + up (one fused GEMM in vLLM)
            (f / tp, h),  # down
        )
        if m.is_mla:
            mla = mla_projection_shapes(m, tp)
            self._gemms = (*((k, n) for n, k in mla["gemm.qkv"] + mla["gemm.o"]),
                           *self._gemms[2:])
        self._attn_gemms = len(self._gemms) - 2
        self._dp = data_parallel_size
        world = tp * data_parallel_size  # vLLM shards MoE layers over TP × DP
        self._ep = world if expert_parallel else 1
        fe = m.intermediate_size / (1 if expert_parallel else world)
        self._expert_gemms = ((h, 2 * fe), (fe, h))  # per expert: gate+up and down
        shared = m.shared_expert_intermediate_size / tp
        self._shared_gemms = ((h, 2 * shared), (shared, h)) if shared else ()
        self._kv_bytes_token_layer = m.kv_bytes_per_token_layer(tp)  # one token, one layer
        self._q_heads = hq / tp
        self._qk_dim = m.q_head_dim + (m.v_head_dim if m.is_mla else m.head_dim)
        self._weight_bytes = w
        # Memoised per-token-count terms (pure functions of their argument).
        self._linear_memo: dict[int, float] = {}
        self._lm_head_memo: dict[int, float] = {}
        self._comm_memo: dict[int, float] = {}

    # -- the work a step does (public: the calibration fits the roofs on these counts) ----------
    @property
    def layer_gemm_shapes(self) -> tuple[tuple[float, float], ...]:
        """(in_features, out_features) per TP rank of a layer's GEMMs: QKV, O, gate+up, down."""
        return self._gemms

    def gemm_flops(self, tokens: float, k: float, n: float) -> float:
        """FLOPs of a ``tokens × k`` by ``k × n`` product."""
        return 2.0 * tokens * k * n

    def gemm_bytes(self, tokens: float, k: float, n: float, num_copies: float = 1.0) -> float:
        """Bytes it moves: ``num_copies`` weight matrices read once, activations in and out."""
        w, a = self._weight_bytes, self.params.activation_bytes
        return num_copies * k * n * w + tokens * (k + n) * a

    # -- pieces ---------------------------------------------------------------------------------
    def _gemm_time(self, tokens: float, k: float, n: float, num_copies: float = 1.0) -> float:
        """One GEMM of ``tokens × k`` by ``k × n`` (``num_copies`` weight matrices read)."""
        if tokens <= 0:
            return 0.0
        flops = self.gemm_flops(tokens, k, n)
        bytes_ = self.gemm_bytes(tokens, k, n, num_copies)
        return max(flops / self._flops_s, bytes_ / self._bw) + self.params.kernel_floor_s

    def _layer_time(self, tokens: int, moe: bool) -> float:
        """One layer's GEMMs: attention projections, then the dense MLP or the MoE layer."""
        total = 0.0
        for k, n in self._gemms[: self._attn_gemms]:
            total += self._gemm_time(tokens, k, n)
        if not moe:
            for k, n in self._gemms[self._attn_gemms :]:
                total += self._gemm_time(tokens, k, n)
            return total
        m = self.model
        # each token runs through top-k experts; the touched experts of this rank read weights
        routed_tokens = tokens * self._dp  # every DP rank's tokens reach this rank
        touched = touched_experts(m.num_experts, m.num_experts_per_token, routed_tokens)
        touched = max(touched / self._ep, 1.0)
        rows = routed_tokens * m.num_experts_per_token / self._ep
        for k, n in self._expert_gemms:
            total += self._gemm_time(rows, k, n, num_copies=touched)
        for k, n in self._shared_gemms:
            total += self._gemm_time(tokens, k, n)
        total += self._gemm_time(tokens, m.hidden_size, m.num_experts)  # router
        return total

    def _linear_layer_time(self, tokens: int) -> float:
        """Every layer's GEMMs of a step (dense layers, then MoE layers)."""
        m = self.model
        dense = m.num_layers - m.num_moe_layers
        total = dense * self._layer_time(tokens, False) if dense else 0.0
        if m.num_moe_layers:
            total += m.num_moe_layers * self._layer_time(tokens, True)
        return total

    def _attention_layer_time(self, shape: BatchShape, window: int = 0) -> float:
        """One layer's attention; ``window`` > 0: a sliding layer (keys capped there)."""
        d, hq = self._qk_dim / 2.0, self._q_heads
        flops = 0.0
        kv_bytes = 0.0
        for q, ctx in zip(shape.prefill_query_lens, shape.prefill_context_lens, strict=True):
            keys = ctx + (q + 1) / 2.0
            if window and keys > window:
                keys = float(window)
            flops += 4.0 * hq * d * q * keys
            read = ctx + q if not window else min(ctx + q, window + q)
            kv_bytes += read * self._kv_bytes_token_layer
        n_dec = shape.num_decode_reqs
        if n_dec:
            kv_tokens = shape.decode_context_sum + n_dec
            if window:
                kv_tokens = min(kv_tokens, n_dec * (window + 1))
            flops += 4.0 * hq * d * kv_tokens
            kv_bytes += kv_tokens * self._kv_bytes_token_layer
        if flops == 0.0:
            return 0.0
        io_bytes = 2.0 * shape.num_tokens * hq * d * self.params.activation_bytes  # Q in, out
        return max(flops / self._attn_flops_s, (kv_bytes + io_bytes) / self._bw) + (
            self.params.kernel_floor_s
        )

    def _attention_time(self, shape: BatchShape) -> float:
        m = self.model
        full = m.num_layers - m.num_sliding_layers
        total = full * self._attention_layer_time(shape)
        if m.num_sliding_layers:
            total += m.num_sliding_layers * self._attention_layer_time(shape, m.sliding_window)
        return total

    def _lm_head_time(self, rows: int) -> float:
        tp = self.tensor_parallel_size
        return self._gemm_time(rows, self.model.hidden_size, self.model.vocab_size / tp)

    def _ep_comm_time(self, tokens: int) -> float:
        """Dispatch and combine of every MoE layer over the DP ranks (DP > 1): a ring
        all-gather of their hidden states and a reduce-scatter back, over TP × DP."""
        if not self.model.is_moe or self._dp <= 1 or tokens == 0:
            return 0.0
        p, gpu = self.tensor_parallel_size * self._dp, self.gpu
        nbytes = tokens * self._dp * self.model.hidden_size * self.params.activation_bytes
        one = (p - 1) / p * nbytes / (gpu.link_bw_bytes_s * gpu.allreduce_efficiency) + (
            gpu.allreduce_latency_s)
        return self.model.num_moe_layers * 2 * one

    def _allreduce_time(self, tokens: int) -> float:
        tp = self.tensor_parallel_size
        if tp == 1 or tokens == 0:
            return 0.0
        nbytes = tokens * self.model.hidden_size * self.params.activation_bytes
        gpu = self.gpu
        return ring_allreduce_s(
            nbytes, tp, gpu.link_bw_bytes_s, gpu.allreduce_efficiency, gpu.allreduce_latency_s
        )

    # -- the protocol ---------------------------------------------------------------------------
    def step_time(self, shape: BatchShape) -> StepTime:
        if shape.num_tokens == 0:
            return StepTime(total_s=0.0)
        layers = self.model.num_layers
        t = shape.num_tokens
        linear = self._linear_memo.get(t)
        if linear is None:
            linear = self._linear_memo[t] = self._linear_layer_time(t)
        rows = shape.num_sampling_reqs
        lm_head = self._lm_head_memo.get(rows)
        if lm_head is None:
            lm_head = self._lm_head_memo[rows] = self._lm_head_time(rows)
        linear += lm_head
        attention = self._attention_time(shape)
        comm = self._comm_memo.get(t)
        if comm is None:
            comm = self._comm_memo[t] = layers * 2 * self._allreduce_time(t) + (
                self._ep_comm_time(t))
        overhead = self.params.step_overhead_s + self.params.per_request_overhead_s * shape.num_reqs
        return StepTime(
            total_s=linear + attention + comm + overhead,
            linear_s=linear,
            attention_s=attention,
            communication_s=comm,
            overhead_s=overhead,
        )

    def decode_step_total(self, num_reqs: int, context_sum: int, context_max: int) -> float:
        """``step_time(...).total_s`` of a pure-decode step of ``num_reqs`` requests whose
        cached contexts sum to ``context_sum`` — the same operations in the same order, so the
        value is bit-identical (the simulator's bulk decode runs rely on it). The roofline
        reads every context once, so the longest (``context_max``) does not matter."""
        layers = self.model.num_layers
        linear = self._linear_memo.get(num_reqs)
        if linear is None:
            linear = self._linear_memo[num_reqs] = self._linear_layer_time(num_reqs)
        lm_head = self._lm_head_memo.get(num_reqs)
        if lm_head is None:
            lm_head = self._lm_head_memo[num_reqs] = self._lm_head_time(num_reqs)
        linear += lm_head
        shape = BatchShape(num_reqs, num_reqs, (), (), num_reqs, context_sum, context_max,
                           num_reqs)
        attention = self._attention_time(shape)
        comm = self._comm_memo.get(num_reqs)
        if comm is None:
            comm = self._comm_memo[num_reqs] = layers * 2 * self._allreduce_time(num_reqs) + (
                self._ep_comm_time(num_reqs))
        overhead = self.params.step_overhead_s + self.params.per_request_overhead_s * num_reqs
        return linear + attention + comm + overhead

    def decode_step_host(self, num_reqs: int) -> tuple[float, float]:
        """The roofline folds host work into its per-step overheads: (0, 0)."""
        return 0.0, 0.0
