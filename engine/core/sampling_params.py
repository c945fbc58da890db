"""Sampling parameters of a request: how to sample and when to stop, validated on creation.

Kept apart from ``engine.core.request`` (which re-exports it) so that its checks stay ordinary
Python when the hot core modules are compiled with mypyc (``twinserve compile``): compiled code
coerces or rejects wrongly typed fields before ``__post_init__`` could explain the problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample and when to stop (the subset of vLLM's ``SamplingParams`` we implement).

    The scheduler reads only the stop fields; the worker's sampler reads the rest. ``stop`` holds
    stop *strings*, matched on the output path after detokenization.
    """

    max_tokens: int = 16  # most output tokens to generate
    min_tokens: int = 0  # EOS/stop tokens cannot end the request before this many outputs
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = disabled
    top_p: float = 1.0  # nucleus mass; 1.0 = disabled
    seed: int | None = None  # per-request generator seed (reproducible sampling)
    stop_token_ids: tuple[int, ...] = ()  # token ids that end the request
    stop: tuple[str, ...] = ()  # strings that end the request (output path)
    ignore_eos: bool = False  # keep generating past EOS (benchmarks)

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if (
            not isinstance(self.min_tokens, int)
            or isinstance(self.min_tokens, bool)
            or not 0 <= self.min_tokens <= self.max_tokens
        ):
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}"
            )
        if not 0 <= self.temperature < math.inf:  # NaN fails too (it samples token 0)
            raise ValueError(f"temperature must be a finite number >= 0, got "
                             f"{self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k!r}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")
