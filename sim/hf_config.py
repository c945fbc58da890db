"""Read a Hugging Face ``config.json`` into a ``ModelSpec``.

The architecture is ``architectures[0]`` (else ``model_type``); each supported family reads
the keys its modeling code reads (facts in ``sim/data/models/SOURCES.md``):

* dense GQA: Llama, Mistral, Qwen2/2.5 (q/k/v biases, which the config does not name), Qwen3
  (per-head q/k norms; ``head_dim`` is read, never derived — it differs from hidden/heads);
* mixture of experts: Mixtral (``num_local_experts``, width ``intermediate_size``), Qwen2-MoE
  (a gated shared expert), Qwen3-MoE (``num_experts``, ``moe_intermediate_size``);
* DeepSeek-V2/V3: multi-head latent attention, shared experts, the first
  ``first_k_dense_replace`` layers dense, V3's score-correction bias;
* gpt-oss: alternating sliding-window layers (``layer_types``), attention sinks and biases,
  expert biases, MXFP4 experts.

A checkpoint's ``quantization_config`` sets the stored weight format: ``fp8`` (DeepSeek-V3's
block-scaled fp8: every decoder linear layer at 1 byte) or ``mxfp4`` (gpt-oss: the experts).
Anything the simulator cannot price is one ``ModelConfigError`` naming the file and what is
supported or missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from sim.models import MXFP4_BYTES, ModelSpec

#: Supported ``architectures[0]`` values and the family each one reads as.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
}
MODEL_TYPES: dict[str, str] = {family: arch for arch, family in ARCHITECTURES.items()}
#: ``quantization_config.quant_method`` values the simulator prices.
QUANT_METHODS = ("fp8", "mxfp4")
_MLA = ("deepseek_v2", "deepseek_v3")


class ModelConfigError(UserError):
    """A config.json the simulator cannot read: the message names the file and the fix."""


def supported_text() -> str:
    return ", ".join(ARCHITECTURES)


def read_config_file(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(the config.json's path, its contents) for a config.json or a model directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ModelConfigError(f"{path}: a model directory needs a config.json")
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{p}: not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: a config.json holds one JSON object")
    return p, data


def load_model_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The ``ModelSpec`` of a config.json (or a model directory holding one)."""
    file, cfg = read_config_file(path)
    return spec_from_config(cfg, name or str(path), where=str(file))


def architecture_of(cfg: Mapping[str, Any], where: str) -> tuple[str, str]:
    """(architecture, family) of a config, or an error naming what is supported."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None:
        model_type = cfg.get("model_type")
        if isinstance(model_type, str) and model_type in MODEL_TYPES:
            arch = MODEL_TYPES[model_type]
        else:
            raise ModelConfigError(
                f"{where}: no 'architectures' (or known 'model_type') key; supported "
                f"architectures: {supported_text()}"
            )
    if arch not in ARCHITECTURES:
        raise ModelConfigError(
            f"{where}: architecture {arch!r} is not supported; supported: {supported_text()}"
        )
    return arch, ARCHITECTURES[arch]


class _Reader:
    """Typed access to a config's keys; collects every missing key for one error."""

    def __init__(self, cfg: Mapping[str, Any], where: str, arch: str) -> None:
        self.cfg, self.where, self.arch = cfg, where, arch
        self.missing: list[str] = []

    def int(self, *names: str, default: int | None = None, positive: bool = True) -> int:
        for name in names:
            value: object = self.cfg.get(name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < (
                    1 if positive else 0):
                kind = "a positive integer" if positive else "an integer >= 0"
                raise ModelConfigError(f"{self.where}: {name!r} must be {kind}, got {value!r}")
            return value
        if default is None:
            self.missing.append(" or ".join(repr(n) for n in names))
            return 1
        return default

    def flag(self, name: str) -> bool:
        return bool(self.cfg.get(name) or False)

    def check(self) -> None:
        if self.missing:
            raise ModelConfigError(
                f"{self.where}: missing key(s) {', '.join(self.missing)} "
                f"(needed for {self.arch})"
            )


def spec_from_config(cfg: Mapping[str, Any], name: str, where: str) -> ModelSpec:
    """The ``ModelSpec`` of a parsed config.json (see the module docstring)."""
    arch, family = architecture_of(cfg, where)
    r = _Reader(cfg, where, arch)
    layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    fields: dict[str, Any] = dict(
        name=name, architecture=arch, num_layers=layers, hidden_size=hidden, num_heads=heads,
        vocab_size=r.int("vocab_size"), max_model_len=r.int("max_position_embeddings"),
        tie_word_embeddings=r.flag("tie_word_embeddings"),
    )
    fields.update(_attention(r, family, hidden, heads))
    fields.update(_MLP[family](r, layers))
    fields.update(_sliding(r, family, layers))
    fields.update(_quantization(cfg, where))
    r.check()
    try:
        return ModelSpec(**fields)
    except ValueError as exc:
        raise ModelConfigError(f"{where}: {exc}") from None


def _attention(r: _Reader, family: str, hidden: int, heads: int) -> dict[str, Any]:
    if family in _MLA:
        q_rank = r.cfg.get("q_lora_rank")
        return dict(
            num_kv_heads=heads,  # MLA caches one latent; num_key_value_heads is not used
            head_dim=r.int("v_head_dim"),
            kv_lora_rank=r.int("kv_lora_rank"),
            q_lora_rank=r.int("q_lora_rank") if q_rank is not None else 0,
            qk_nope_head_dim=r.int("qk_nope_head_dim"),
            qk_rope_head_dim=r.int("qk_rope_head_dim"),
            v_head_dim=r.int("v_head_dim"),
        )
    kv_heads = r.int("num_key_value_heads", default=heads)
    derived = hidden // heads if heads and hidden % heads == 0 else 0
    # a missing hidden_size is reported already; head_dim is missing only when not derivable
    head_dim = r.int("head_dim", default=derived or (1 if r.missing else None))
    if not r.missing and heads % kv_heads:  # placeholders stand in for missing keys
        raise ModelConfigError(
            f"{r.where}: num_attention_heads {heads} is not a multiple of "
            f"num_key_value_heads {kv_heads}"
        )
    gpt_oss = family == "gpt_oss"
    return dict(
        num_kv_heads=kv_heads, head_dim=head_dim,
        qkv_bias=family in ("qwen2", "qwen2_moe") or r.flag("attention_bias"),
        o_bias=r.flag("attention_bias"),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        attention_sinks=gpt_oss,
    )


def _dense_mlp(r: _Reader, layers: int) -> dict[str, Any]:
    return dict(intermediate_size=r.int("intermediate_size"))


def _mixtral(r: _Reader, layers: int) -> dict[str, Any]:
    return dict(intermediate_size=r.int("intermediate_size"),
                num_experts=r.int("num_local_experts"),
                num_experts_per_token=r.int("num_experts_per_tok"))


def _qwen_moe_dense_layers(r: _Reader, layers: int) -> int:
    """Layers whose MLP is dense: those in ``mlp_only_layers`` or off ``decoder_sparse_step``."""
    step = r.int("decoder_sparse_step", default=1)
    only = r.cfg.get("mlp_only_layers") or []
    if not isinstance(only, list):
        raise ModelConfigError(f"{r.where}: 'mlp_only_layers' must be a list of layer indices")
    return sum(1 for i in range(layers) if i in only or (i + 1) % step)


def _qwen2_moe(r: _Reader, layers: int) -> dict[str, Any]:
    out = _qwen3_moe(r, layers)
    out.update(shared_expert_intermediate_size=r.int("shared_expert_intermediate_size"),
               shared_expert_gate=True)
    return out


def _qwen3_moe(r: _Reader, layers: int) -> dict[str, Any]:
    dense = _qwen_moe_dense_layers(r, layers)
    return dict(intermediate_size=r.int("moe_intermediate_size"),
                num_experts=r.int("num_experts"),
                num_experts_per_token=r.int("num_experts_per_tok"),
                num_dense_layers=dense,
                dense_intermediate_size=r.int("intermediate_size") if dense else 0)


def _deepseek(r: _Reader, layers: int) -> dict[str, Any]:
    first_dense = r.int("first_k_dense_replace", default=0, positive=False)
    freq = r.int("moe_layer_freq", default=1)
    dense = sum(1 for i in range(layers) if i < first_dense or i % freq)
    experts = r.int("n_routed_experts")
    width = r.int("moe_intermediate_size")
    correction = r.cfg.get("topk_method") == "noaux_tc" or r.cfg.get("model_type") == (
        "deepseek_v3")
    return dict(intermediate_size=width, num_experts=experts,
                num_experts_per_token=r.int("num_experts_per_tok"),
                num_dense_layers=dense,
                dense_intermediate_size=r.int("intermediate_size") if dense else 0,
                shared_expert_intermediate_size=r.int(
                    "n_shared_experts", default=0, positive=False) * width,
                router_bias_vectors=1 if correction else 0)


def _gpt_oss(r: _Reader, layers: int) -> dict[str, Any]:
    return dict(intermediate_size=r.int("intermediate_size"),
                num_experts=r.int("num_local_experts"),
                num_experts_per_token=r.int("num_experts_per_tok", "experts_per_token"),
                expert_bias=True, router_bias_vectors=1)


_MLP: dict[str, Callable[[_Reader, int], dict[str, Any]]] = {
    "llama": _dense_mlp, "mistral": _dense_mlp, "qwen2": _dense_mlp, "qwen3": _dense_mlp,
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "gpt_oss": _gpt_oss,
}


def _sliding(r: _Reader, family: str, layers: int) -> dict[str, Any]:
    """Sliding-window layers: gpt-oss's ``layer_types``; Qwen2's ``use_sliding_window`` from
    ``max_window_layers`` on; Mistral's ``sliding_window`` on every layer."""
    window = r.cfg.get("sliding_window")
    if family in _MLA or not window:
        return {}
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ModelConfigError(f"{r.where}: 'sliding_window' must be a positive integer")
    types = r.cfg.get("layer_types")
    if isinstance(types, list):
        sliding = sum(1 for t in types if t == "sliding_attention")
    elif family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not r.flag("use_sliding_window"):
            return {}
        sliding = layers - min(r.int("max_window_layers", default=layers), layers)
    else:
        sliding = layers
    if window >= 2**31:  # a window beyond any context is no window
        return {}
    return dict(sliding_window=window, num_sliding_layers=min(sliding, layers))


def _quantization(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    q = cfg.get("quantization_config")
    if not q:
        return {}
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method == "fp8":
        return dict(linear_weight_bytes=1)
    if method == "mxfp4":
        return dict(expert_weight_bytes=MXFP4_BYTES)
    raise ModelConfigError(
        f"{where}: checkpoint quantization {method!r} is not priced; supported: "
        f"{', '.join(QUANT_METHODS)} checkpoints, or bf16/fp16 ones (with --quantization fp8 "
        "for online fp8)"
    )
