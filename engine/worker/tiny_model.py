"""``twinserve make-tiny-model``: a small random Llama/Qwen2 checkpoint in Hugging Face format.

Responsibility: write a directory that both twinserve and ``transformers`` load as a real
checkpoint — ``config.json`` (classic Hub keys: ``architectures``, ``rope_theta``,
``rope_scaling``, ``torch_dtype``), ``generation_config.json``, ``model.safetensors`` (or shards
plus ``model.safetensors.index.json``), ``tokenizer.json`` and ``tokenizer_config.json`` with a
chat template — so demos and tests need no download.

Deterministic from ``seed``: weights are drawn from one seeded CPU generator in a fixed order.
Weights are N(0, ``init_std``) — larger than a trained model's 0.02, so attention is sharp and
logits well separated: a wrong RoPE, GQA mapping, mask or KV cache changes the greedy tokens.
RMSNorm weights are ``1 + N(0, 0.1)`` so a mishandled norm weight shows too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from engine.core.config import ConfigError
from engine.output_dir import OutputDir
from engine.resources import check_memory
from engine.worker.tiny_tokenizer import build_tokenizer_files

Arch = Literal["llama", "qwen2"]
#: The most parameters a tiny model may have (4 GB of float32 weights).
MAX_PARAMS = 1_000_000_000
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Size and flavour of a tiny checkpoint. ``None`` fields take the flavour's default."""

    arch: Arch = "llama"  # "llama" (Llama 3 style) or "qwen2" (QKV bias, tied embeddings)
    vocab_size: int = 384  # tokenizer and model vocabulary
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # GQA: 2 query heads per KV head
    head_dim: int | None = None  # None = hidden_size // num_attention_heads
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rope_scaling: bool = True  # llama3 scaling with a short original context (llama only)
    tie_word_embeddings: bool | None = None  # None: llama False, qwen2 True
    init_std: float = 0.15  # std of random weights
    dtype: str = "float32"  # stored dtype
    num_shards: int = 1  # > 1 writes model.safetensors.index.json + shards
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in _ARCHITECTURES:
            raise ConfigError(f"arch must be one of {', '.join(_ARCHITECTURES)}, got {self.arch!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                     "num_shards"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.head_dim is not None and self.head_dim < 1:
            raise ConfigError(f"head_dim must be >= 1, got {self.head_dim!r}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be in [0, 2^63), got {self.seed!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ConfigError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        tensors = 3 + 12 * min(self.num_hidden_layers, MAX_PARAMS)
        if self.num_shards > tensors:
            raise ConfigError(f"num_shards must be at most the number of tensors (about "
                              f"{tensors}), got {self.num_shards}")
        if self.num_params() > MAX_PARAMS:
            raise ConfigError(
                f"a tiny model has at most {MAX_PARAMS:,} parameters; these sizes give "
                f"{self.num_params():,}"
            )

    def num_params(self) -> int:
        """Parameters of the checkpoint (weights and biases)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.resolved_head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        bias = q + 2 * kv if self.arch == "qwen2" else 0
        layer = h * (q + 2 * kv) + bias + q * h + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tied else 2)
        return self.num_hidden_layers * layer + embed + h

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def tied(self) -> bool:
        if self.tie_word_embeddings is None:
            return self.arch == "qwen2"
        return self.tie_word_embeddings


def _hf_config(spec: TinyModelSpec, bos: int | None, eos: int) -> dict[str, object]:
    config: dict[str, object] = {
        "architectures": [_ARCHITECTURES[spec.arch]],
        "model_type": spec.arch,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.resolved_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tied,
        "torch_dtype": spec.dtype,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "initializer_range": spec.init_std,
        "use_cache": True,
    }
    if spec.arch == "llama":
        config["attention_bias"] = False
        config["mlp_bias"] = False
        config["rope_scaling"] = (
            {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
            if spec.rope_scaling else None
        )
    else:
        config["use_sliding_window"] = False
        config["sliding_window"] = None
    return config


def random_weights(spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    """Hugging Face-named tensors of the tiny model, drawn in a fixed order from ``seed``."""
    g = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    h, i, d = spec.hidden_size, spec.intermediate_size, spec.resolved_head_dim
    q, kv = spec.num_attention_heads * d, spec.num_key_value_heads * d

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * spec.init_std).to(dtype)

    def norm_weight() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(h, generator=g)).to(dtype)

    tensors = {"model.embed_tokens.weight": normal(spec.vocab_size, h)}
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = norm_weight()
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            tensors[f"{p}self_attn.{name}.weight"] = normal(rows, h)
            if spec.arch == "qwen2":
                tensors[f"{p}self_attn.{name}.bias"] = normal(rows)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, q)
        tensors[p + "post_attention_layernorm.weight"] = norm_weight()
        tensors[p + "mlp.gate_proj.weight"] = normal(i, h)
        tensors[p + "mlp.up_proj.weight"] = normal(i, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, i)
    tensors["model.norm.weight"] = norm_weight()
    if not spec.tied:
        tensors["lm_head.weight"] = normal(spec.vocab_size, h)
    return tensors


def _save_weights(out: Path, tensors: dict[str, torch.Tensor], num_shards: int) -> None:
    from safetensors.torch import save_file

    names = list(tensors)
    if num_shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    per_shard = -(-len(names) // num_shards)
    weight_map: dict[str, str] = {}
    for k in range(num_shards):
        file = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
        chunk = {n: tensors[n] for n in names[k * per_shard : (k + 1) * per_shard]}
        save_file(chunk, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def make_tiny_model(out_dir: str | Path, spec: TinyModelSpec) -> Path:
    """Write the checkpoint + tokenizer into ``out_dir``, whole or not at all (a rerun
    replaces it; a second writer of the same directory is refused); returns it. The weights
    must fit in this machine's memory, twice (drawn in float32, then stored)."""
    check_memory(2 * 4 * spec.num_params(), f"a tiny model of {spec.num_params():,} parameters",
                 "choose smaller sizes")
    with OutputDir(out_dir, "checkpoint", what="model directory").open() as target:
        _write_checkpoint(target.staging, spec)
        data = [p.name for p in sorted(target.staging.glob("*.safetensors"))]
        target.commit(data=["config.json", "tokenizer.json", *data])
    return Path(out_dir)


def _write_checkpoint(out: Path, spec: TinyModelSpec) -> None:
    info = build_tokenizer_files(out, spec.arch, spec.vocab_size)
    config = _hf_config(spec, info.bos_token_id, info.eos_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "bos_token_id": info.bos_token_id,
        "eos_token_id": [info.eos_token_id, *info.extra_eos_token_ids],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _save_weights(out, random_weights(spec), spec.num_shards)
    (out / "twinserve_tiny_spec.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    readable = 0o666 & ~_umask()  # safetensors writes 0600: the checkpoint is for everyone
    for path in out.glob("*.safetensors"):
        path.chmod(readable)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
