"""A Llama-family decoder (Llama 2/3, Qwen2) over a flattened varlen batch and a paged KV cache.

Responsibility: the forward pass of ``ModelConfig``'s architecture — embedding, ``L`` × (RMSNorm →
GQA attention with RoPE → residual → RMSNorm → SwiGLU MLP → residual), final RMSNorm and LM
head — with numerics that follow ``transformers``' eager implementation op for op (fp32 RMSNorm
statistics, fp32 RoPE angles), so that in fp32 the logits agree with ``LlamaForCausalLM`` /
``Qwen2ForCausalLM`` to rounding.

Layout: all scheduled tokens of a step form one ``[num_tokens, hidden]`` batch (no padding, no
batch dimension); ``AttentionMetadata`` says which rows belong to which sequence. Q/K/V and
gate/up are fused into one matmul each at load time (``load_weights`` maps the Hugging Face
tensor names onto the fused parameters and checks every shape). Attention goes through
``PagedAttention`` — the kernels' backend switch — over per-layer ``(k_cache, v_cache)``.

Parallelism (vLLM's ``ColumnParallelLinear``/``RowParallelLinear``/``VocabParallelEmbedding``,
through ``engine.worker.distributed.ParallelContext``): with TP ranks, QKV and gate/up are
column-parallel (each rank holds its heads and its slice of the MLP width; KV heads are
replicated when TP exceeds them), O and down are row-parallel (partial sums all-reduced, the
bias added once after), the embedding and the LM head are vocab-parallel (each rank holds a
contiguous slice of the vocabulary: out-of-slice ids embed to zero before the all-reduce, the
logits are all-gathered). With pipeline stages a rank builds only its stage's decoder layers
(``engine.core.parallel.pp_layer_range``); the first stage embeds, the last holds the final norm
and the LM head (a copy of the embedding when they are tied and on different stages).
``load_weights`` copies each rank's shard of every checkpoint tensor (``shard_plan``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.parallel import pp_layer_range
from engine.worker.attention import AttentionMetadata, PagedAttention
from engine.worker.distributed import SINGLE_RANK, ParallelContext
from engine.worker.errors import CheckpointError
from engine.worker.model_config import ModelConfig
from engine.worker.rope import RotaryEmbedding, apply_rotary
from engine.worker.shard import ShardPlan, WeightTarget, shard_plan

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache) of one layer

#: Checkpoint tensors that are derived state, not weights (older Llama checkpoints store them).
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


class _Placement:
    """dtype + device every parameter is created with."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype = dtype
        self.device = device


def _linear(in_features: int, out_features: int, bias: bool, spec: _Placement) -> nn.Linear:
    """An ``nn.Linear`` with uninitialised storage (weights are loaded or filled later)."""
    linear = nn.utils.skip_init(  # type: ignore[no-untyped-call]
        nn.Linear, in_features, out_features, bias=bias, dtype=spec.dtype, device=spec.device
    )
    return cast(nn.Linear, linear)


class RMSNorm(nn.Module):
    """``weight * x / rms(x)`` with fp32 statistics, cast back before the weight (as HF does)."""

    def __init__(self, hidden_size: int, eps: float, spec: _Placement) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=spec.dtype, device=spec.device), requires_grad=False
        )
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = self.weight * x32.to(dtype)
        return out


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_shard @ W_shard^T) + b``: the input dimension is split over the TP
    ranks; the bias (whole on every rank) is added once, after the reduction."""

    def __init__(self, in_local: int, out_features: int, bias: bool, spec: _Placement,
                 ctx: ParallelContext) -> None:
        super().__init__()
        self.linear = _linear(in_local, out_features, False, spec)
        self.bias = (
            nn.Parameter(torch.zeros(out_features, dtype=spec.dtype, device=spec.device),
                         requires_grad=False) if bias else None
        )
        self.ctx = ctx

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.ctx.all_reduce(self.linear(x))
        if self.bias is not None:
            out = out + self.bias
        return out


class Attention(nn.Module):
    """Fused QKV projection (column-parallel), RoPE, paged attention over this rank's heads,
    output projection (row-parallel)."""

    def __init__(self, config: ModelConfig, attention: PagedAttention, spec: _Placement,
                 plan: ShardPlan, ctx: ParallelContext) -> None:
        super().__init__()
        self.num_heads = plan.num_heads
        self.num_kv_heads = plan.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = plan.q_size, plan.kv_size
        self.qkv_proj = _linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, config.qkv_bias, spec
        )
        self.o_proj = RowParallelLinear(self.q_size, config.hidden_size, config.o_bias, spec, ctx)
        self.attention = attention

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = self.attention(q, k, v, kv_cache[0], kv_cache[1], meta)
        projected: torch.Tensor = self.o_proj(out.reshape(n, self.q_size))
        return projected


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul
    (column-parallel: this rank's slice of the width) and down row-parallel."""

    def __init__(self, config: ModelConfig, spec: _Placement, plan: ShardPlan,
                 ctx: ParallelContext) -> None:
        super().__init__()
        self.intermediate_size = plan.intermediate_size
        self.gate_up_proj = _linear(
            config.hidden_size, 2 * plan.intermediate_size, config.mlp_bias, spec
        )
        self.down_proj = RowParallelLinear(
            plan.intermediate_size, config.hidden_size, config.mlp_bias, spec, ctx
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, attention: PagedAttention, spec: _Placement,
                 plan: ShardPlan, ctx: ParallelContext) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec)
        self.self_attn = Attention(config, attention, spec, plan, ctx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec)
        self.mlp = MLP(config, spec, plan, ctx)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, meta)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head of a Llama-family model — or of this
    rank's shard of it (``ctx``: its tensor rank and pipeline stage)."""

    def __init__(
        self,
        config: ModelConfig,
        attention: PagedAttention,
        *,
        dtype: torch.dtype,
        device: torch.device,
        ctx: ParallelContext = SINGLE_RANK,
    ) -> None:
        super().__init__()
        spec = _Placement(dtype, device)
        place = ctx.place
        self.config = config
        self.dtype = dtype
        self.device = device
        self.ctx = ctx
        self.plan = plan = shard_plan(config, place.tp_size, place.tp_rank)
        self.layer_range = pp_layer_range(config.num_hidden_layers, place.pp_size, place.pp_rank)
        self.is_first_stage = place.is_first_stage
        self.is_last_stage = place.is_last_stage
        self.embed_tokens: nn.Embedding | None = None
        if place.is_first_stage or (place.is_last_stage and config.tie_word_embeddings):
            self.embed_tokens = cast(nn.Embedding, nn.utils.skip_init(  # type: ignore[no-untyped-call]
                nn.Embedding, plan.vocab_per_rank, config.hidden_size, dtype=dtype,
                device=device,
            ))
        self.layers = nn.ModuleList(
            DecoderLayer(config, attention, spec, plan, ctx) for _ in self.layer_range
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec)
        self.lm_head = (
            None if config.tie_word_embeddings or not place.is_last_stage
            else _linear(config.hidden_size, plan.vocab_per_rank, False, spec)
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, device)
        self.requires_grad_(False)
        if plan.vocab_per_rank * plan.tp_size != config.vocab_size:
            for table in (self.embed_tokens, self.lm_head):
                if table is not None:
                    table.weight.data.zero_()  # the padding rows past the vocabulary stay 0

    @property
    def attention(self) -> PagedAttention:
        """The attention op every layer shares (swap it with ``set_attention``)."""
        first = self.layers[0]
        assert isinstance(first, DecoderLayer)
        return first.self_attn.attention

    def set_attention(self, attention: PagedAttention) -> None:
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.attention = attention

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[KVCache],
        meta: AttentionMetadata,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` after this stage's layers (before the final
        norm): the first stage embeds ``input_ids``, later stages continue from ``hidden``."""
        h: torch.Tensor = self.embed(input_ids) if hidden is None else hidden
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, kv_cache, meta)
        return h

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: ids outside this rank's slice embed to zero, then the
        TP ranks' rows are summed."""
        table = self.embed_tokens
        assert table is not None, "only the first pipeline stage embeds"
        plan = self.plan
        if plan.tp_size == 1:
            out: torch.Tensor = table(input_ids)
            return out
        local = input_ids - plan.vocab_start
        outside = (local < 0) | (local >= plan.vocab_per_rank)
        rows = table(local.masked_fill(outside, 0))
        rows.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.ctx.all_reduce(rows)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[rows, vocab]`` of the given (un-normed) hidden rows (last stage):
        each TP rank's vocabulary slice, all-gathered."""
        head = self.lm_head if self.lm_head is not None else self.embed_tokens
        assert head is not None, "only the last pipeline stage computes logits"
        logits = F.linear(self.norm(hidden), head.weight)
        if self.plan.tp_size > 1:
            logits = self.ctx.all_gather_last_dim(logits)[:, : self.config.vocab_size]
        return logits.float()

    # -- weights --------------------------------------------------------------------------------
    def wants_weight(self, name: str) -> bool:
        """Whether this rank reads the checkpoint tensor ``name``: its stage's tensors, and any
        tensor it does not know (so that ``load_weights`` can name it)."""
        if _is_layer_weight(name):
            return name in self._weight_targets()
        known = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
        return name not in known or name in self._weight_targets()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
        """Copy this rank's shard of every Hugging Face-named tensor into the (fused)
        parameters; every tensor this rank needs must be present."""
        params = dict(self.named_parameters())
        targets = self._weight_targets()
        loaded: set[str] = set()
        for name, tensor in weights:
            if _IGNORED.match(name) or (name == "lm_head.weight"
                                        and self.config.tie_word_embeddings):
                continue
            if name not in targets:
                if _is_layer_weight(name):
                    continue  # another pipeline stage's layer
                raise CheckpointError(f"{where}: unexpected tensor {name!r} for this architecture")
            for target in targets[name]:
                target.copy(tensor, params[target.param], name, where)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise CheckpointError(f"{where}: missing tensor(s) {', '.join(missing[:3])}{more}")

    def _weight_targets(self) -> dict[str, list[WeightTarget]]:
        """HF tensor name → where this rank's shard of it goes (computed once)."""
        cached: dict[str, list[WeightTarget]] | None = self.__dict__.get("_targets")
        if cached is None:
            cached = self.__dict__["_targets"] = self._make_weight_targets()
        return cached

    def _make_weight_targets(self) -> dict[str, list[WeightTarget]]:
        c, plan = self.config, self.plan
        targets: dict[str, list[WeightTarget]] = {}

        def add(hf: str, target: WeightTarget) -> None:
            targets.setdefault(hf, []).append(target)

        if self.embed_tokens is not None:
            rows = plan.vocab_rows()
            if self.is_first_stage:
                add("model.embed_tokens.weight", rows.into("embed_tokens.weight"))
            if self.lm_head is None and self.is_last_stage and not self.is_first_stage:
                add("model.embed_tokens.weight", rows.into("embed_tokens.weight"))
        if self.is_last_stage:
            add("model.norm.weight", WeightTarget.whole("norm.weight"))
            if self.lm_head is not None:
                add("lm_head.weight", plan.vocab_rows().into("lm_head.weight"))
        for local, i in enumerate(self.layer_range):
            hf, ours = f"model.layers.{i}.", f"layers.{local}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                add(f"{hf}{norm}.weight", WeightTarget.whole(f"{ours}{norm}.weight"))
            kinds = ("weight", "bias") if c.qkv_bias else ("weight",)
            for kind in kinds:
                dest = f"{ours}self_attn.qkv_proj.{kind}"
                add(f"{hf}self_attn.q_proj.{kind}", plan.q_rows(0).into(dest))
                add(f"{hf}self_attn.k_proj.{kind}", plan.kv_rows(plan.q_size).into(dest))
                add(f"{hf}self_attn.v_proj.{kind}",
                    plan.kv_rows(plan.q_size + plan.kv_size).into(dest))
            add(f"{hf}self_attn.o_proj.weight",
                plan.q_columns().into(f"{ours}self_attn.o_proj.linear.weight"))
            if c.o_bias:
                add(f"{hf}self_attn.o_proj.bias",
                    WeightTarget.whole(f"{ours}self_attn.o_proj.bias"))
            mlp_kinds = ("weight", "bias") if c.mlp_bias else ("weight",)
            for kind in mlp_kinds:
                dest = f"{ours}mlp.gate_up_proj.{kind}"
                add(f"{hf}mlp.gate_proj.{kind}", plan.mlp_rows(0).into(dest))
                add(f"{hf}mlp.up_proj.{kind}", plan.mlp_rows(plan.intermediate_size).into(dest))
            add(f"{hf}mlp.down_proj.weight",
                plan.mlp_columns().into(f"{ours}mlp.down_proj.linear.weight"))
            if c.mlp_bias:
                add(f"{hf}mlp.down_proj.bias", WeightTarget.whole(f"{ours}mlp.down_proj.bias"))
        return targets

    def init_dummy_weights(self, seed: int, std: float = 0.02) -> None:
        """Random weights (vLLM's ``load_format="dummy"``): N(0, std), norms 1, biases 0."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.data.fill_(1.0)
            elif name.endswith(".bias"):
                param.data.zero_()
            else:
                param.data.normal_(0.0, std, generator=generator)


_LAYER_WEIGHT = re.compile(r"^model\.layers\.\d+\.")


def _is_layer_weight(name: str) -> bool:
    return _LAYER_WEIGHT.match(name) is not None
