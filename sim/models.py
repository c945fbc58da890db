"""Model architecture catalog (facts from each model's config.json).

Names are Hugging Face ids. A ``ModelSpec`` derives the counts a cost model needs: parameters of
the linear layers, weight bytes, KV bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.core.errors import UserError


class UnknownModelError(UserError):
    """An unknown model name; the message lists the catalog."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape (dense or mixture-of-experts)."""

    name: str  # Hugging Face id
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # MLP width (per expert for MoE)
    vocab_size: int
    max_model_len: int  # default context length (config's max_position_embeddings)
    num_experts: int = 1  # MoE experts per layer (1 = dense)
    num_experts_per_token: int = 1  # experts each token is routed to
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2  # model dtype: activations, embeddings, unquantized weights (bf16)
    linear_weight_bytes: int | None = None  # layers' linear weights (1: fp8); None: dtype_bytes
    kv_cache_bytes: int | None = None  # one K or V element in the cache (1: fp8); None: dtype

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")

    @property
    def linear_bytes(self) -> int:
        """Bytes per parameter of the decoder layers' linear weights."""
        return self.dtype_bytes if self.linear_weight_bytes is None else self.linear_weight_bytes

    @property
    def kv_bytes(self) -> int:
        """Bytes per K or V element in the KV cache."""
        return self.dtype_bytes if self.kv_cache_bytes is None else self.kv_cache_bytes

    def with_dtypes(self, *, fp8_weights: bool, fp8_kv_cache: bool) -> ModelSpec:
        """This model with fp8 (1-byte) linear weights and/or KV cache, as vLLM's
        ``--quantization fp8`` and ``--kv-cache-dtype fp8`` store them (embedding and LM head
        stay in the model dtype)."""
        return replace(
            self,
            linear_weight_bytes=1 if fp8_weights else None,
            kv_cache_bytes=1 if fp8_kv_cache else None,
        )

    # -- parameter counts (per layer unless stated) ---------------------------------------------
    @property
    def attn_params(self) -> int:
        """QKV and output projections of one layer."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    @property
    def expert_params(self) -> int:
        """One gated (SwiGLU) MLP: gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def mlp_params(self) -> int:
        """All experts of one layer (what must be stored)."""
        return self.expert_params * self.num_experts

    @property
    def active_mlp_params(self) -> int:
        """MLP weights one token multiplies with."""
        return self.expert_params * self.num_experts_per_token

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_layers * (self.attn_params + self.mlp_params) + self.embedding_params + (
            lm_head
        )

    @property
    def weight_bytes(self) -> int:
        """Stored weights: the layers' linear weights at ``linear_bytes``, the embedding (and
        an untied LM head) at ``dtype_bytes``."""
        layers = self.num_layers * (self.attn_params + self.mlp_params)
        return layers * self.linear_bytes + (self.total_params - layers) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072),
        ModelSpec("meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
        ModelSpec("meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
        ModelSpec("meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
        ModelSpec("Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 131072),
        ModelSpec("Qwen/Qwen2.5-32B", 64, 5120, 40, 8, 128, 27648, 152064, 131072),
        ModelSpec(
            "mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
            num_experts=8, num_experts_per_token=2,
        ),
    )
}

#: Short aliases accepted on the command line.
ALIASES: dict[str, str] = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
}


def get_model(name: str) -> ModelSpec:
    """Look a model up by Hugging Face id or alias (case-insensitive)."""
    key = name.strip()
    by_lower = {k.lower(): k for k in MODELS}
    canonical = by_lower.get(key.lower()) or ALIASES.get(key.lower())
    if canonical is None:
        raise UnknownModelError(
            f"unknown model {name!r}; valid: {', '.join(MODELS)} "
            f"(aliases: {', '.join(ALIASES)})"
        )
    return MODELS[canonical]


def check_tensor_parallel(model: ModelSpec, tensor_parallel_size: int) -> None:
    """Refuse a TP size the cost models cannot price for ``model``: the layout rule both worlds
    share (``engine/core/parallel.py``: TP divides the heads), then a power of two (the only
    sizes the cost models price)."""
    from engine.core.config import ConfigError
    from engine.core.parallel import ParallelConfig

    tp = tensor_parallel_size
    ParallelConfig(tensor_parallel_size=tp).check_model(
        model.num_heads, model.num_kv_heads, model.num_layers, model.name)
    if tp & (tp - 1):
        raise ConfigError(f"tensor_parallel_size must be a power of two >= 1, got {tp}")
