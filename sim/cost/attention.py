"""Attention of a vLLM step on one GPU, from measured tables: GQA (full or sliding window)
and DeepSeek's multi-head latent attention (MLA).

GQA (``sim/cost/kernel_tables.py`` grids at this model's per-GPU heads and head size):

* decode — the batch at its mean context, no faster than its longest context alone; a
  sliding-window layer attends to at most ``window`` keys, so its contexts are capped there;
* prefill — the chunks as ``P`` equal-work sequences of ``sqrt(Σ work / P)`` tokens on the
  causal prefill grid, where a chunk of ``q`` new tokens after ``c`` cached ones does
  ``q·(q + 2c)`` units (``q·min(q + 2c, 2·window)`` in a sliding layer), and no faster than
  reading its KV. Decodes and prefill chunks share one varlen call (one kernel floor saved).

MLA (vLLM's MLA backends; the latent cache holds ``kv_lora_rank + qk_rope_head_dim`` elements
per token, shared by all heads):

* with measured module tables (DeepSeek-V3's dimensions on the GPU): the whole attention
  module — projections, latent cache, attention, output projection — for the decodes
  (absorbed, "data-movement friendly" form) and, separately, for the prefill chunks (the
  "compute friendly" form that re-expands K and V); the step's QKV/O GEMM terms are then 0;
* otherwise an estimate: the projections are GEMMs (``mla_projection_shapes``) and the
  attention is the GQA grid at (heads, 1 KV head) with the read scaled by the latent's size
  (decode) or the MHA grid scaled by MLA's wider query/key heads (prefill).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.core.outputs import BatchShape
from sim.cost.interp import Grid
from sim.cost.kernel_tables import KernelTables
from sim.models import ModelSpec

#: DeepSeek-V3's MLA dimensions (hidden, q_lora_rank, kv_lora_rank, nope, rope, v): the shape
#: the measured MLA module tables were collected at.
MLA_TABLE_SHAPE = (7168, 1536, 512, 128, 64, 128)


def _mla_shape(m: ModelSpec) -> tuple[int, ...]:
    return (m.hidden_size, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim,
            m.qk_rope_head_dim, m.v_head_dim)


def mla_projection_shapes(m: ModelSpec, tp: int) -> dict[str, list[tuple[float, float]]]:
    """(n, k) of the GEMMs of one MLA layer per TP rank, by term: ``gemm.qkv`` (query
    projections, the replicated KV latent projection, and the per-head latent up/down
    projections the absorbed form multiplies with), ``gemm.o`` (output projection)."""
    heads = m.num_heads / tp
    h = float(m.hidden_size)
    qd = float(m.q_head_dim)
    if m.q_lora_rank:
        q = [(float(m.q_lora_rank), h), (heads * qd, float(m.q_lora_rank))]
    else:
        q = [(heads * qd, h)]
    latent = float(m.kv_lora_rank)
    qkv = [
        *q,
        (latent + m.qk_rope_head_dim, h),  # kv_a, not split by TP
        (heads * latent, float(m.qk_nope_head_dim)),  # W_UK absorbed into the query
        (heads * m.v_head_dim, latent),  # W_UV on the attention output
    ]
    return {"gemm.qkv": qkv, "gemm.o": [(h, heads * m.v_head_dim)]}


class AttentionCost:
    """Attention time of a step's decodes and prefill chunks, all layers (seconds)."""

    def __init__(self, model: ModelSpec, tables: KernelTables, tp: int, kv_cache_dtype: str,
                 gemm_dtype: str) -> None:
        self.model = model
        self.layers = model.num_layers
        self.window = model.sliding_window
        self.sliding_layers = model.num_sliding_layers
        self.full_layers = model.num_layers - model.num_sliding_layers
        self.mla_module = False
        kv = kv_cache_dtype
        self.kv_len_scale = 1.0
        if not tables.has_attention("decode", kv):
            # no fp8-KV rows (e.g. A100): half the bytes ≈ the bf16 kernel at half the length
            kv = "bfloat16"
            self.kv_len_scale = 0.5
        kv_pre = kv if tables.has_attention("prefill", kv) else "bfloat16"
        hq = model.num_heads // tp
        if model.is_mla:
            self._set_up_mla(tables, hq, kv, kv_pre, kv_cache_dtype, gemm_dtype)
        else:
            hk = max(model.num_kv_heads // tp, 1)
            dec = tables.attention_grid("decode", kv, hq, hk, model.head_dim)
            pre = tables.attention_grid("prefill", kv_pre, hq, hk, model.head_dim)
            self._dec, self._pre = dec.grid, pre.grid
            self._read = dec.grid
            self._read_scale = 1.0
            self.decode_source = f"{dec.how} heads, {kv} KV" + (
                " (fp8 KV estimated as bf16 at half the length)" if self.kv_len_scale < 1
                else "")
            self.prefill_source = f"{pre.how} heads, {kv_pre} KV"
        if self.sliding_layers:
            self.decode_source += f"; {self.sliding_layers} layers slide over {self.window}"
        # one varlen call serves decodes and prefill chunks together: one floor saved
        self.floor_us = 0.0 if model.is_mla else min(self._dec.at(1.0, 2.0),
                                                      self._pre.at(1.0, 1.0))

    def _set_up_mla(self, tables: KernelTables, heads: int, kv: str, kv_pre: str,
                    kv_cache_dtype: str, gemm_dtype: str) -> None:
        gemm = "fp8_block" if gemm_dtype == "fp8" else "bfloat16"
        dec = pre = None
        if _mla_shape(self.model) == MLA_TABLE_SHAPE:
            mla_kv = "fp8" if kv_cache_dtype == "fp8" else "bfloat16"
            dec = tables.mla_grid("decode", mla_kv, gemm, heads)
            pre = tables.mla_grid("prefill", mla_kv, gemm, heads)
            if pre is None:  # no fp8-KV prefill rows: the bf16-KV module
                pre = tables.mla_grid("prefill", "bfloat16", gemm, heads)
        if dec is not None and pre is not None:
            self.mla_module = True
            self._dec, self._pre, self._read, self._read_scale = dec, pre, dec, 1.0
            self.kv_len_scale = 1.0
            where = f"measured MLA module ({heads} heads, {kv_cache_dtype} KV, {gemm} GEMMs, "
            self.decode_source = where + f"{tables.system}): projections included"
            self.prefill_source = self.decode_source
            return
        m = self.model
        latent_bytes = (m.kv_lora_rank + m.qk_rope_head_dim) / (2.0 * 128)  # vs K+V at d=128
        dec_g = tables.attention_grid("decode", kv, heads, 1)
        self._dec = _scaled(dec_g.grid, latent_bytes)
        self._read, self._read_scale = dec_g.grid, latent_bytes
        width = (m.q_head_dim + m.v_head_dim) / 256.0  # QK and V head widths vs 128 + 128
        pre_g = tables.attention_grid("prefill", kv_pre, heads, heads)
        self._pre = _scaled(pre_g.grid, width)
        self.decode_source = (f"estimate: MLA latent read as {dec_g.how} (heads, 1 KV head) × "
                              f"{latent_bytes:g}")
        self.prefill_source = f"estimate: {pre_g.how} (MHA) × {width:g} for MLA's head widths"

    # -- decode ---------------------------------------------------------------------------------
    def decode_s(self, num_reqs: int, context_sum: int, context_max: int) -> float:
        """The decodes' attention (all layers): the batch at its mean context, no faster than
        its longest context alone; sliding layers at contexts capped by the window."""
        scale = self.kv_len_scale
        mean_kv = (context_sum / num_reqs + 1.0) * scale
        longest_kv = (context_max + 1.0) * scale
        total = self.full_layers * self._decode_layer(num_reqs, mean_kv, longest_kv)
        if self.sliding_layers:
            cap = self.window * scale
            total += self.sliding_layers * self._decode_layer(
                num_reqs, min(mean_kv, cap), min(longest_kv, cap))
        return total * 1e-6

    def _decode_layer(self, num_reqs: int, mean_kv: float, longest_kv: float) -> float:
        t = self._dec.at(float(num_reqs), mean_kv)
        longest = self._dec.at(1.0, longest_kv)
        return t if t > longest else longest

    # -- prefill --------------------------------------------------------------------------------
    def prefill_s(self, shape: BatchShape) -> float:
        """The prefill chunks' attention (all layers): ``P`` equal-work sequences, no faster
        than reading their KV."""
        queries, contexts = shape.prefill_query_lens, shape.prefill_context_lens
        p = float(len(queries))
        kv = 0
        for q, c in zip(queries, contexts, strict=True):
            kv += q + c
        read = self._read.at(p, kv / p * self.kv_len_scale) * self._read_scale
        full = self._prefill_layer(p, _work(queries, contexts, 0), read)
        total = self.full_layers * full
        if self.sliding_layers:
            capped = min(kv / p, self.window + sum(queries) / p)
            read_w = self._read.at(p, capped * self.kv_len_scale) * self._read_scale
            total += self.sliding_layers * self._prefill_layer(
                p, _work(queries, contexts, self.window), read_w)
        return total * 1e-6

    def _prefill_layer(self, p: float, work: float, read: float) -> float:
        t = self._pre.at(p, math.sqrt(work / p))
        return t if t > read else read


def _work(queries: Sequence[int], contexts: Sequence[int], window: int) -> float:
    """Attention work of prefill chunks in units of q·(keys attended, counted twice)."""
    work = 0.0
    for q, c in zip(queries, contexts, strict=True):
        span = q + 2.0 * c
        if window and span > 2.0 * window:
            span = 2.0 * window
        work += q * span
    return work


def _scaled(grid: Grid, factor: float) -> Grid:
    """``grid`` × ``factor`` (an estimate's work ratio), as a grid."""
    from sim.cost.interp import Curve

    curves = [Curve(c.xs, [y * factor for y in c.ys], log_x=c.log_x, exponent=c.exponent)
              for c in grid.curves]
    return Grid(grid.rows, curves)
