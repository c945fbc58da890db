"""Reference generations from Hugging Face ``transformers`` (a test-only dependency).

Greedy decoding is done by hand — one full forward of the whole sequence per new token, eager
attention, fp32, no KV cache — so the reference shares nothing with the engine under test but
the checkpoint. Each step also records the gap between the best and second-best logit: the
engine must reproduce the tokens exactly, which is meaningful only while that gap is far above
fp32 rounding (~1e-6); tests assert a minimum gap instead of hoping.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class GreedyReference:
    token_ids: list[int]  # greedy continuation
    min_margin: float  # smallest top-1 minus top-2 logit gap along the way


@functools.cache
def load_hf_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


@torch.no_grad()
def hf_logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """fp32 logits ``[len(token_ids), vocab]`` of one full-sequence forward."""
    return load_hf_model(model_dir)(torch.tensor([token_ids])).logits[0].float()


@torch.no_grad()
def hf_greedy(model_dir: Path, prompt: list[int], max_tokens: int) -> GreedyReference:
    model = load_hf_model(model_dir)
    out: list[int] = []
    margin = float("inf")
    for _ in range(max_tokens):
        logits = model(torch.tensor([prompt + out])).logits[0, -1]
        top = logits.topk(2).values
        margin = min(margin, float(top[0] - top[1]))
        out.append(int(logits.argmax()))
    return GreedyReference(out, margin)


def random_prompts(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]
