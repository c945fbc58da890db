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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine.worker.attention import AttentionMetadata, PagedAttention
from engine.worker.errors import CheckpointError
from engine.worker.model_config import ModelConfig
from engine.worker.rope import RotaryEmbedding, apply_rotary

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


class Attention(nn.Module):
    """Fused QKV projection, RoPE, paged attention, output projection."""

    def __init__(self, config: ModelConfig, attention: PagedAttention, spec: _Placement) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = _linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, config.qkv_bias, spec
        )
        self.o_proj = _linear(self.q_size, config.hidden_size, config.o_bias, spec)
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
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig, spec: _Placement) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = _linear(
            config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, spec
        )
        self.down_proj = _linear(
            config.intermediate_size, config.hidden_size, config.mlp_bias, spec
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, attention: PagedAttention, spec: _Placement) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec)
        self.self_attn = Attention(config, attention, spec)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec)
        self.mlp = MLP(config, spec)

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
    """Embedding, decoder layers, final norm and LM head of a Llama-family model."""

    def __init__(
        self,
        config: ModelConfig,
        attention: PagedAttention,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        spec = _Placement(dtype, device)
        self.config = config
        self.dtype = dtype
        self.device = device
        self.embed_tokens = cast(nn.Embedding, nn.utils.skip_init(  # type: ignore[no-untyped-call]
            nn.Embedding, config.vocab_size, config.hidden_size, dtype=dtype, device=device
        ))
        self.layers = nn.ModuleList(
            DecoderLayer(config, attention, spec) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, spec)
        self.lm_head = (
            None if config.tie_word_embeddings
            else _linear(config.hidden_size, config.vocab_size, False, spec)
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, device)
        self.requires_grad_(False)

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
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` before the final norm."""
        h: torch.Tensor = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, kv_cache, meta)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[rows, vocab]`` of the given (un-normed) hidden rows."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm(hidden), weight).float()

    # -- weights --------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
        """Copy Hugging Face-named tensors into the (fused) parameters; all must be present."""
        params = dict(self.named_parameters())
        targets = self._weight_targets()
        loaded: set[str] = set()
        for name, tensor in weights:
            if _IGNORED.match(name) or (name == "lm_head.weight" and self.lm_head is None):
                continue
            if name not in targets:
                raise CheckpointError(f"{where}: unexpected tensor {name!r} for this architecture")
            param_name, start, length = targets[name]
            dest = params[param_name].data
            if start is not None:
                dest = dest.narrow(0, start, length)
            if tuple(tensor.shape) != tuple(dest.shape):
                raise CheckpointError(
                    f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(dest.shape)} from config.json"
                )
            dest.copy_(tensor.to(device=dest.device, dtype=dest.dtype))
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise CheckpointError(f"{where}: missing tensor(s) {', '.join(missing[:3])}{more}")

    def _weight_targets(self) -> dict[str, tuple[str, int | None, int]]:
        """HF tensor name → (our parameter, first row of its shard or None, rows)."""
        c = self.config
        targets: dict[str, tuple[str, int | None, int]] = {
            "model.embed_tokens.weight": ("embed_tokens.weight", None, 0),
            "model.norm.weight": ("norm.weight", None, 0),
        }
        if self.lm_head is not None:
            targets["lm_head.weight"] = ("lm_head.weight", None, 0)
        q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
        shards = {
            "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
            "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
            "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
            "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
            "mlp.up_proj": ("mlp.gate_up_proj", inter, inter),
        }
        plain = ["self_attn.o_proj", "mlp.down_proj"]
        for i in range(c.num_hidden_layers):
            hf, ours = f"model.layers.{i}.", f"layers.{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                targets[f"{hf}{norm}.weight"] = (f"{ours}{norm}.weight", None, 0)
            for kind, has_bias in (("weight", True), ("bias", c.qkv_bias)):
                if not has_bias:
                    continue
                for src in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                    dst, start, rows = shards[src]
                    targets[f"{hf}{src}.{kind}"] = (f"{ours}{dst}.{kind}", start, rows)
            for src in ("mlp.gate_proj", "mlp.up_proj"):
                dst, start, rows = shards[src]
                targets[f"{hf}{src}.weight"] = (f"{ours}{dst}.weight", start, rows)
                if c.mlp_bias:
                    targets[f"{hf}{src}.bias"] = (f"{ours}{dst}.bias", start, rows)
            for src in plain:
                targets[f"{hf}{src}.weight"] = (f"{ours}{src}.weight", None, 0)
                if (src == "self_attn.o_proj" and c.o_bias) or (src == "mlp.down_proj"
                                                                 and c.mlp_bias):
                    targets[f"{hf}{src}.bias"] = (f"{ours}{src}.bias", None, 0)
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
