"""Model architectures as the cost models and the KV-cache sizing see them.

A ``ModelSpec`` is the shape of a decoder-only transformer read from its Hugging Face
``config.json`` (``sim/hf_config.py``): attention (GQA with optional biases, q/k norms and
sinks, or DeepSeek's multi-head latent attention), the MLP (dense, or a mixture of experts with
shared experts and leading dense layers), sliding-window layers, and the checkpoint's weight
formats. It derives the counts a cost model needs: parameters by part (the published totals
are matched within 2%, ``tests/sim/test_model_catalog.py``), weight bytes, KV bytes per token
and what one GPU holds of each under tensor and expert parallelism.

The catalog (``sim/data/models/``: the config.json files of commonly deployed models, with
their sources) is read by ``sim/model_catalog.py``; ``get_model`` (there) takes a catalog name, an
alias, or a path to a config.json or a model directory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.core.errors import UserError

#: Bytes per weight of an MXFP4 tensor: 4-bit values plus one 8-bit scale per 32 values.
MXFP4_BYTES = 0.53125


class UnknownModelError(UserError):
    """An unknown model name; the message lists the catalog."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape (dense or mixture-of-experts).

    Dense models use only the first block of fields. ``intermediate_size`` is the width of
    the MLP that most layers run: the dense MLP, or one routed expert of a MoE model.
    """

    name: str  # Hugging Face id (catalog) or the config file's path
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # MLP width (per routed expert for MoE)
    vocab_size: int
    max_model_len: int  # default context length (config's max_position_embeddings)
    num_experts: int = 1  # routed experts per MoE layer (1 = dense)
    num_experts_per_token: int = 1  # experts each token is routed to
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2  # model dtype: activations, embeddings, unquantized weights (bf16)
    linear_weight_bytes: int | None = None  # layers' linear weights (1: fp8); None: dtype_bytes
    kv_cache_bytes: int | None = None  # one K or V element in the cache (1: fp8); None: dtype
    architecture: str = "LlamaForCausalLM"  # config.json ``architectures[0]``
    # -- attention variants ---------------------------------------------------------------------
    qkv_bias: bool = False  # biases on the q, k, v projections (Qwen2, gpt-oss)
    o_bias: bool = False  # bias on the output projection (gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    attention_sinks: bool = False  # one learned sink logit per head (gpt-oss)
    sliding_window: int = 0  # tokens a sliding-window layer attends to (0: none)
    num_sliding_layers: int = 0  # layers with sliding-window attention (gpt-oss: every other)
    # -- multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = not MLA ------------------
    kv_lora_rank: int = 0  # width of the cached KV latent
    q_lora_rank: int = 0  # width of the query latent (0: a direct query projection)
    qk_nope_head_dim: int = 0  # per-head query/key width without rotary embedding
    qk_rope_head_dim: int = 0  # rotary part, shared by all heads in the cache
    v_head_dim: int = 0  # per-head value width
    # -- mixture of experts ---------------------------------------------------------------------
    num_dense_layers: int = 0  # MoE models: layers with a dense MLP instead (DeepSeek: first k)
    dense_intermediate_size: int = 0  # their MLP width
    shared_expert_intermediate_size: int = 0  # summed width of a MoE layer's shared experts
    shared_expert_gate: bool = False  # a sigmoid gate (hidden -> 1) on the shared expert
    expert_bias: bool = False  # biases in every expert's projections (gpt-oss)
    router_bias_vectors: int = 0  # per-expert vectors beside the router weight (bias, correction)
    expert_weight_bytes: float | None = None  # checkpoint format of the experts (MXFP4 0.53125)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")
        if not 0 <= self.num_dense_layers <= self.num_layers:
            raise ValueError(f"{self.name}: num_dense_layers must be in [0, num_layers]")
        if not 0 <= self.num_sliding_layers <= self.num_layers:
            raise ValueError(f"{self.name}: num_sliding_layers must be in [0, num_layers]")
        if self.num_experts_per_token > self.num_experts:
            raise ValueError(f"{self.name}: more experts per token than experts")

    # -- kinds ----------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    # -- dtypes ---------------------------------------------------------------------------------
    @property
    def linear_bytes(self) -> int:
        """Bytes per parameter of the decoder layers' linear weights."""
        return self.dtype_bytes if self.linear_weight_bytes is None else self.linear_weight_bytes

    @property
    def expert_bytes(self) -> float:
        """Bytes per parameter of the routed experts' weights."""
        return self.linear_bytes if self.expert_weight_bytes is None else self.expert_weight_bytes

    @property
    def kv_bytes(self) -> int:
        """Bytes per K or V element in the KV cache."""
        return self.dtype_bytes if self.kv_cache_bytes is None else self.kv_cache_bytes

    def with_dtypes(self, *, fp8_weights: bool, fp8_kv_cache: bool) -> ModelSpec:
        """This model with fp8 (1-byte) linear weights and/or KV cache, as vLLM's
        ``--quantization fp8`` and ``--kv-cache-dtype fp8`` store them (embedding and LM head
        stay in the model dtype; MXFP4 experts stay MXFP4)."""
        return replace(
            self,
            linear_weight_bytes=1 if fp8_weights else self.linear_weight_bytes,
            kv_cache_bytes=1 if fp8_kv_cache else None,
        )

    # -- parameter counts (per layer unless stated) ---------------------------------------------
    @property
    def q_head_dim(self) -> int:
        """Width of one query (and key) head: head_dim, or MLA's nope + rope parts."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def attn_params(self) -> int:
        """Weights (and biases) of one layer's attention projections."""
        h, nh = self.hidden_size, self.num_heads
        if self.is_mla:
            qd = self.q_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * nh * qd if self.q_lora_rank
                 else h * nh * qd)
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)  # latent + shared rope key
            kv_b = self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + nh * self.v_head_dim * h
        d, nkv = self.head_dim, self.num_kv_heads
        params = h * nh * d + 2 * h * nkv * d + nh * d * h
        if self.qkv_bias:
            params += nh * d + 2 * nkv * d
        if self.o_bias:
            params += h
        if self.attention_sinks:
            params += nh
        return params

    @property
    def attn_norm_params(self) -> int:
        """Norms inside one layer's attention (q/k norms; MLA's latent norms)."""
        if self.is_mla:
            return self.kv_lora_rank + self.q_lora_rank
        return 2 * self.head_dim if self.qk_norm else 0

    @property
    def expert_params(self) -> int:
        """One routed expert (a gated MLP: gate, up and down projections)."""
        f = self.intermediate_size
        bias = 2 * f + self.hidden_size if self.expert_bias else 0
        return 3 * self.hidden_size * f + bias

    @property
    def shared_expert_params(self) -> int:
        """A MoE layer's shared experts (and their gate): dense, run for every token."""
        h = self.hidden_size
        return 3 * h * self.shared_expert_intermediate_size + (h if self.shared_expert_gate else 0)

    @property
    def router_params(self) -> int:
        if not self.is_moe:
            return 0
        return (self.hidden_size + self.router_bias_vectors) * self.num_experts

    @property
    def dense_mlp_params(self) -> int:
        """One dense layer's MLP (the dense layers of a MoE model use their own width)."""
        width = self.dense_intermediate_size if self.is_moe else self.intermediate_size
        return 3 * self.hidden_size * width

    @property
    def mlp_params(self) -> int:
        """One layer's MLP as stored: all its experts (+ shared experts and router) for a MoE
        model, the dense MLP otherwise (a MoE model's dense layers: ``dense_mlp_params``)."""
        if not self.is_moe:
            return self.dense_mlp_params
        return self.num_experts * self.expert_params + self.shared_expert_params + (
            self.router_params)

    @property
    def decoder_params(self) -> int:
        """Every layer's attention and MLP weights (what the linear layers store)."""
        dense = self.num_layers - self.num_moe_layers
        moe = self.num_moe_layers * self.mlp_params if self.is_moe else 0
        return self.num_layers * self.attn_params + dense * self.dense_mlp_params + moe

    @property
    def routed_expert_params(self) -> int:
        """All layers' routed experts."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        """Two RMSNorms per layer, the norms inside attention, the final norm."""
        return self.num_layers * (2 * self.hidden_size + self.attn_norm_params) + self.hidden_size

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.decoder_params + self.norm_params + self.embedding_params + lm_head

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies with: all but the routed experts it skips."""
        skipped = self.num_experts - self.num_experts_per_token
        return self.total_params - self.num_moe_layers * skipped * self.expert_params

    @property
    def weight_bytes(self) -> int:
        """Stored weights: the layers' linear weights at ``linear_bytes`` (routed experts at
        ``expert_bytes``), norms, embedding and an untied LM head at ``dtype_bytes``."""
        return round(self.weight_bytes_per_gpu(1, 1))

    def weight_bytes_per_gpu(self, tensor_parallel_size: int, moe_shard_size: int = 1,
                             pipeline_parallel_size: int = 1) -> float:
        """One GPU's share of the weights: the linear layers split over TP, the routed experts
        over ``moe_shard_size`` GPUs instead when larger (vLLM shards MoE layers over TP × DP,
        whole experts or slices: the same bytes), the layers over pipeline stages; norms
        replicated; embedding and LM head split over TP (vocabulary-parallel)."""
        tp, ep, pp = tensor_parallel_size, max(moe_shard_size, tensor_parallel_size), (
            pipeline_parallel_size)
        routed = self.routed_expert_params
        linear = self.decoder_params - routed
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        experts = routed * self.expert_bytes / ep
        layers = (linear * self.linear_bytes / tp + experts) / pp
        return layers + self.norm_params * self.dtype_bytes + (
            (self.embedding_params + lm_head) * self.dtype_bytes / tp)

    # -- KV cache -------------------------------------------------------------------------------
    def kv_bytes_per_token_layer(self, tensor_parallel_size: int = 1) -> float:
        """One token's KV bytes in one full-attention layer on one GPU. MLA caches one latent
        of ``kv_lora_rank + qk_rope_head_dim`` per token, replicated on every TP rank; GQA's K
        and V heads are split over TP, and replicated once TP exceeds the KV heads."""
        if self.is_mla:
            return float((self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes)
        heads = max(self.num_kv_heads / tensor_parallel_size, 1.0)
        return 2 * heads * self.head_dim * self.kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of every full-attention layer for one token (one copy, no TP). Sliding-window
        layers hold at most the window per request and are not counted per token."""
        return round(self.num_full_attention_layers * self.kv_bytes_per_token_layer(1))

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int,
                                   pipeline_parallel_size: int = 1) -> float:
        """What one GPU stores per cached token (its layers, its KV heads)."""
        return (self.num_full_attention_layers * self.kv_bytes_per_token_layer(
            tensor_parallel_size) / pipeline_parallel_size)

    def sliding_kv_bytes_per_request_per_gpu(self, tensor_parallel_size: int,
                                             block_size: int) -> float:
        """Worst-case KV bytes of one request's sliding-window layers on one GPU: the window
        plus one block (the window need not start at a block boundary)."""
        if not self.num_sliding_layers:
            return 0.0
        tokens = self.sliding_window + block_size
        return self.num_sliding_layers * tokens * self.kv_bytes_per_token_layer(
            tensor_parallel_size)


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
