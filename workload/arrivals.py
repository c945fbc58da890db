"""vllm bench serve's synthetic arrival process.

Gaps ~ Gamma(shape=burstiness, scale=1/(rate·burstiness)) drawn with numpy's legacy
``RandomState(seed)`` (what ``np.random.seed(seed); np.random.gamma`` gives in vllm bench),
cumulated and rescaled so the last request is sent at exactly N/rate; rate ``inf`` sends
everything at t=0, burstiness ``inf`` spaces requests evenly.
"""

from __future__ import annotations

import math

import numpy as np


def synthetic_send_times(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times of ``n`` requests at ``rate`` requests/s (see the module docstring)."""
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.RandomState(seed).gamma(
            shape=burstiness, scale=1.0 / (rate * burstiness), size=n
        )
    times = np.cumsum(gaps)
    if times[-1] != 0:
        times *= (n / rate) / times[-1]
    return times
