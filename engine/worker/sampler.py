"""Token sampling from one step's logits: greedy, temperature, top-k, top-p, min_tokens, seeds.

Responsibility: given fp32 logits ``[rows, vocab]`` (one row per request that samples this step)
and each row's parameters, pick one token per row, in vLLM V1's way:

1. ``min_tokens``: while a request has fewer outputs than ``min_tokens``, its EOS and stop token
   ids get ``-inf`` (so they cannot end it early);
2. greedy rows (``temperature < 1e-5``) take the argmax (the first index on ties, as
   ``transformers`` does);
3. random rows: logits ÷ temperature → top-k → top-p (vLLM's sort-based masking) → softmax →
   one draw by the exponential race ``argmax(p / q), q ~ Exp(1)``, which samples exactly
   ``Categorical(p)``. A row with a ``seed`` draws ``q`` from its own ``torch.Generator`` (created
   once per request, so its tokens do not depend on what else is in the batch, nor on
   chunking, preemption or async scheduling); other rows draw from the engine's generator
   (seeded at start-up, so whole runs are reproducible too).

Stop *strings* are not handled here: they are matched after detokenization on the output path
(``engine.serve.frontend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5


@dataclass(frozen=True, slots=True)
class RowSampling:
    """One sampling row's parameters (built by the model runner from the request state)."""

    temperature: float  # 0 (< SAMPLING_EPS) = greedy
    top_k: int  # <= 0 = disabled
    top_p: float  # 1.0 = disabled
    generator: torch.Generator | None  # the request's own generator (seeded requests)
    banned_token_ids: tuple[int, ...] = ()  # masked this step (min_tokens not reached yet)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def apply_banned_tokens(logits: torch.Tensor, rows: Sequence[RowSampling]) -> None:
    """In place: ``-inf`` for each row's banned token ids (ids outside the vocab are ignored)."""
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        ids = [t for t in row.banned_token_ids if 0 <= t < vocab]
        if ids:
            logits[i, ids] = float("-inf")


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask logits outside each row's top-k / nucleus with ``-inf`` (vLLM's sort-based rule).

    ``top_k [rows]`` int64 in ``[1, vocab]`` (vocab = disabled); ``top_p [rows]`` in ``(0, 1]``.
    Values tied with the k-th largest are kept; the top token always survives top-p.
    """
    if top_k is None and top_p is None:
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth_index = (logits_sort.shape[1] - top_k).unsqueeze(1)
        kth_value = logits_sort.gather(1, kth_index)
        logits_sort.masked_fill_(logits_sort < kth_value, float("-inf"))
    if top_p is not None:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        mask = probs_sum <= 1 - top_p.unsqueeze(1)
        mask[:, -1] = False
        logits_sort.masked_fill_(mask, float("-inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def exponential_race(
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator | None,
) -> torch.Tensor:
    """One categorical draw per row: ``argmax(probs / q)`` with ``q ~ Exp(1)`` per element."""
    q = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        q.exponential_(generator=default_generator)
    else:
        if unseeded:
            rows = torch.empty((len(unseeded), probs.shape[1]), dtype=probs.dtype,
                               device=probs.device)
            rows.exponential_(generator=default_generator)
            q[unseeded] = rows
        for i, g in enumerate(generators):
            if g is not None:
                q[i].exponential_(generator=g)
    return probs.div(q).argmax(dim=-1)


class Sampler:
    """Picks one token per row; owns the engine-wide generator for unseeded random rows."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
        """int64 token ids ``[rows]`` for fp32 ``logits [rows, vocab]`` (modified in place)."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logit rows but {len(rows)} sampling rows")
        apply_banned_tokens(logits, rows)
        greedy = [row.is_greedy for row in rows]
        if all(greedy):
            return logits.argmax(dim=-1)
        return self._sample_random(logits, rows, greedy)

    def _sample_random(
        self, logits: torch.Tensor, rows: Sequence[RowSampling], greedy: list[bool]
    ) -> torch.Tensor:
        greedy_tokens = logits.argmax(dim=-1) if any(greedy) else None
        vocab = logits.shape[1]
        dev = logits.device
        temps = torch.tensor(
            [1.0 if g else r.temperature for g, r in zip(greedy, rows, strict=True)],
            dtype=torch.float32, device=dev,
        )
        logits = logits / temps.unsqueeze(1)
        top_k = top_p = None
        if any(0 < r.top_k < vocab for r in rows):
            top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows],
                                 dtype=torch.int64, device=dev)
        if any(r.top_p < 1.0 for r in rows):
            top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=dev)
        probs = apply_top_k_top_p(logits, top_k, top_p).softmax(dim=-1)
        tokens = exponential_race(probs, [r.generator for r in rows], self.generator)
        if greedy_tokens is None:
            return tokens
        mask = torch.tensor(greedy, dtype=torch.bool, device=dev)
        return torch.where(mask, greedy_tokens, tokens)
