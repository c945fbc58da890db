"""Rotary position embeddings (RoPE) as Hugging Face's Llama computes them, bit for bit in fp32.

Responsibility: the inverse frequencies of a ``RopeConfig`` (``default``, ``linear`` and Llama 3.1's
``llama3`` band-wise scaling) and their application to query/key heads at arbitrary absolute
positions. Positions come per token from the flattened batch, so a prefill chunk or a decode at
position ``p`` rotates exactly as the full-sequence forward of ``transformers`` does at ``p``.

The rotation is the "rotate half" (GPT-NeoX) layout that HF Llama/Qwen2 checkpoints use: the
first and second halves of each head form the (x, y) pairs. Angles are computed in fp32
(``positions * inv_freq``), then cos/sin are cast to the activation dtype, as in ``transformers``.
"""

from __future__ import annotations

import math

import torch

from engine.worker.model_config import RopeConfig


def compute_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """fp32 ``[head_dim // 2]`` inverse frequencies, scaled as ``rope.rope_type`` says."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.rope_theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, interpolate between."""
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Holds the inverse frequencies on the model's device; rotates q/k at given positions."""

    def __init__(self, rope: RopeConfig, head_dim: int, device: torch.device) -> None:
        self.head_dim = head_dim
        self.inv_freq = compute_inv_freq(rope, head_dim).to(device)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [num_tokens, 1, head_dim]`` in ``dtype`` for int ``positions``."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [num_tokens, num_heads, head_dim]``; returns a new contiguous tensor."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
