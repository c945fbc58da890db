"""Seeded request lengths: vllm bench serve's ``random`` dataset draws."""

from __future__ import annotations

import math

import numpy as np


def uniform_lengths(
    rng: np.random.Generator, n: int, mean: int, ratio: float
) -> np.ndarray:
    """``n`` lengths uniform in ``[mean·(1−ratio), mean·(1+ratio)]`` (at least 1), as vllm bench
    draws its random dataset."""
    low = max(1, math.floor(mean * (1 - ratio)))
    high = max(low, math.ceil(mean * (1 + ratio)))
    return rng.integers(low, high + 1, size=n).astype(np.int64)
