"""Build a ready-to-run ``LlamaModel`` from a checkpoint directory (or dummy weights).

Responsibility: resolve the device, the dtype and the attention backend, construct the model
and fill its weights — from the checkpoint's safetensors files, or randomly (``"dummy"``, vLLM's
load format for benchmarks). Every user mistake is a ``UserError`` subclass with one clear line.
"""

from __future__ import annotations

import torch

from engine.core.config import ConfigError
from engine.worker.attention import PagedAttention
from engine.worker.checkpoint import iter_weights
from engine.worker.distributed import SINGLE_RANK, ParallelContext
from engine.worker.errors import DeviceError
from engine.worker.model import LlamaModel
from engine.worker.model_config import ModelConfig, canonical_dtype, load_model_config
from kernels import select_backend

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
}


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda if available else cpu; raises DeviceError for unavailable devices."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"device {name!r} is not a valid torch device") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {name!r} requested but CUDA is not available here")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise DeviceError(f"device {name!r} is not supported (use cpu or cuda)")
    return device


def resolve_dtype(name: str, model_config: ModelConfig) -> torch.dtype:
    """``auto`` → the checkpoint's dtype; otherwise the named dtype."""
    key = model_config.dtype if name == "auto" else canonical_dtype(name)
    return TORCH_DTYPES[key]


def make_attention(
    model_config: ModelConfig, device: torch.device, backend: str | None = None
) -> PagedAttention:
    """The paged-attention op on ``kernels.select_backend(device, backend)``."""
    try:
        resolved = select_backend(device, backend)
    except ValueError as exc:
        raise ConfigError(f"attention backend: {exc}") from None
    return PagedAttention(resolved, scale=model_config.head_dim**-0.5)


def load_model(
    model_dir: str,
    *,
    dtype: str = "auto",
    device: str | torch.device = "auto",
    attention_backend: str | None = None,
    load_format: str = "safetensors",
    seed: int = 0,
    dummy_weight_std: float = 0.02,
    ctx: ParallelContext = SINGLE_RANK,
) -> LlamaModel:
    """The model of ``model_dir/config.json`` with its weights loaded (or dummy weights) — or
    this rank's shard of it: only the tensors of its pipeline stage are read, and each is cut
    to its tensor-parallel slice (``engine.worker.shard``)."""
    model_config = load_model_config(model_dir)
    place = ctx.place
    place.parallel.check_model(
        model_config.num_attention_heads, model_config.num_key_value_heads,
        model_config.num_hidden_layers, model_dir,
    )
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    model = LlamaModel(
        model_config,
        make_attention(model_config, dev, attention_backend),
        dtype=resolve_dtype(dtype, model_config),
        device=dev,
        ctx=ctx,
    )
    if load_format == "dummy":
        model.init_dummy_weights(seed, dummy_weight_std)
    else:
        model.load_weights(iter_weights(model_dir, dev, wanted=model.wants_weight), model_dir)
    return model
