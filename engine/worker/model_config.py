"""The architecture of a Llama-family checkpoint, read from its Hugging Face ``config.json``.

Responsibility: turn ``config.json`` (both the classic keys ``rope_theta``/``rope_scaling``/
``torch_dtype`` of Hub checkpoints and transformers 5's ``rope_parameters``/``dtype``) into one
frozen, validated ``ModelConfig``, or raise a ``CheckpointError`` / ``UnsupportedModelError`` that
names the key. No torch here: dtypes stay names, so the core-side code (engine args, the CLI) can
read a model's limits without loading torch.

Supported families: ``LlamaForCausalLM`` (optional ``attention_bias`` on q/k/v/o, ``mlp_bias``)
and ``Qwen2ForCausalLM`` (bias on q/k/v only, no sliding window). RoPE: ``default``, ``linear``
and ``llama3`` scaling.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.paths import PathError, input_dir, read_text
from engine.worker.errors import CheckpointError, UnsupportedModelError

CONFIG_FILE = "config.json"
#: Architecture name → family (the family decides which projections carry biases).
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
_MODEL_TYPES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
#: dtype names accepted in config.json and on the command line, mapped to canonical names.
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32", "float": "float32", "fp32": "float32",
    "float16": "float16", "half": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters (HF ``rope_parameters``); unused fields keep defaults."""

    rope_type: str = "default"  # "default", "linear" or "llama3"
    rope_theta: float = 10000.0  # base of the inverse frequencies
    factor: float = 1.0  # linear / llama3 scaling factor
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only: pre-training context

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope scaling type {self.rope_type!r} is not supported; supported: "
                f"{', '.join(ROPE_TYPES)}"
            )
        if not (0 < self.rope_theta < math.inf and 0 < self.factor < math.inf):
            raise CheckpointError("rope_theta and the rope scaling factor must be finite "
                                  f"numbers > 0, got {self.rope_theta!r} and {self.factor!r}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise CheckpointError(
                "llama3 rope scaling needs high_freq_factor > low_freq_factor > 0"
            )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One decoder-only Llama-family architecture. Invariant: heads divide evenly (GQA)."""

    architecture: str  # a key of SUPPORTED_ARCHITECTURES
    vocab_size: int  # rows of the embedding and the LM head
    hidden_size: int  # residual stream width
    intermediate_size: int  # SwiGLU width
    num_hidden_layers: int  # decoder layers
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # KV heads (GQA when fewer than query heads)
    head_dim: int  # elements per head
    rms_norm_eps: float  # RMSNorm epsilon
    max_position_embeddings: int  # longest context the checkpoint declares
    rope: RopeConfig  # rotary embedding parameters
    tie_word_embeddings: bool  # LM head shares the embedding matrix
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2; Llama attention_bias)
    o_bias: bool  # output projection carries a bias (Llama attention_bias)
    mlp_bias: bool  # gate/up/down carry biases (Llama mlp_bias)
    dtype: str  # checkpoint dtype name: "float32", "float16" or "bfloat16"
    bos_token_id: int | None = None  # from config.json, if given
    eos_token_ids: tuple[int, ...] = ()  # from config.json (may list several)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CheckpointError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise CheckpointError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not 0 < self.rms_norm_eps < 1:  # NaN fails too: every RMSNorm would output NaN
            raise CheckpointError(f"rms_norm_eps must be a number in (0, 1), got "
                                  f"{self.rms_norm_eps!r}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise CheckpointError(f"unsupported dtype {self.dtype!r}")

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count (weights only, biases ignored)."""
        h, i = self.hidden_size, self.intermediate_size
        per_layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embed + h

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], where: str = CONFIG_FILE) -> ModelConfig:
        """Build from a parsed ``config.json``; errors name ``where`` and the key."""
        return _parse(raw, where)


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read ``model_dir/config.json``; raises CheckpointError / UnsupportedModelError."""
    try:
        path = input_dir(model_dir, "model directory")
    except PathError as exc:
        raise CheckpointError(f"{exc} (local checkpoint paths only)") from None
    file = path / CONFIG_FILE
    if not os.path.lexists(file):
        raise CheckpointError(f"{file} is missing: not a Hugging Face checkpoint directory")
    try:
        raw = json.loads(read_text(file, "checkpoint config"))
    except PathError as exc:
        raise CheckpointError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} must hold a JSON object")
    return _parse(raw, str(file))


def canonical_dtype(name: str, where: str = "dtype") -> str:
    """Map a dtype name or alias (``bf16``, ``half``, ``torch.float32``…) to its canonical name."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPE_ALIASES:
        raise UnsupportedModelError(
            f"{where}={name!r} is not supported; use float32, float16 or bfloat16"
        )
    return DTYPE_ALIASES[key]


def _architecture(raw: dict[str, Any], where: str) -> str:
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs:
        for arch in archs:
            if arch in SUPPORTED_ARCHITECTURES:
                return str(arch)
        raise UnsupportedModelError(
            f"{where}: architecture {', '.join(map(str, archs))} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    model_type = raw.get("model_type")
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise UnsupportedModelError(
        f"{where}: model_type {model_type!r} (no 'architectures' list) is not supported; "
        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _get(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise CheckpointError(f"{where} has no {key!r}")
    return raw[key]


def _rope(raw: dict[str, Any], where: str) -> RopeConfig:
    params = raw.get("rope_parameters")
    if not isinstance(params, dict):
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    try:
        return RopeConfig(
            rope_type=str(rope_type),
            rope_theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
            **{k: type(getattr(RopeConfig(), k))(params[k]) for k in fields if k in params},
        )
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{where}: {exc}") from None
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: malformed rope parameters {params!r}") from None


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _parse(raw: dict[str, Any], where: str) -> ModelConfig:
    arch = _architecture(raw, where)
    family = SUPPORTED_ARCHITECTURES[arch]
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"{where}: hidden_act {act!r} is not supported (only silu)")
    if family == "qwen2" and raw.get("use_sliding_window"):
        raise UnsupportedModelError(f"{where}: sliding-window attention is not supported")
    heads = _get(raw, "num_attention_heads", where)
    hidden = _get(raw, "hidden_size", where)
    head_dim = raw.get("head_dim") or (hidden // heads if isinstance(hidden, int) and heads else 0)
    attention_bias = bool(raw.get("attention_bias", False))
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    rope = _rope(raw, where)
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=_get(raw, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=_get(raw, "intermediate_size", where),
            num_hidden_layers=_get(raw, "num_hidden_layers", where),
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rope=rope,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family == "llama" and attention_bias,
            mlp_bias=family == "llama" and bool(raw.get("mlp_bias", False)),
            dtype=canonical_dtype(dtype, f"{where}: dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos_ids(raw.get("eos_token_id")),
        )
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, UnsupportedModelError):
            raise
        raise CheckpointError(f"{where}: malformed value ({exc})") from None
