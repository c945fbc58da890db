"""vllm bench serve's synthetic arrival process, and its ramp-up.

Gaps ~ Gamma(shape=burstiness, scale=1/(rate·burstiness)) drawn with numpy's legacy
``RandomState(seed)`` (what ``np.random.seed(seed); np.random.gamma`` gives in vllm bench),
cumulated and rescaled so the last request is sent at exactly N/rate; rate ``inf`` sends
everything at t=0, burstiness ``inf`` spaces requests evenly.

With a ramp-up (vllm bench's ``--ramp-up-strategy linear|exponential`` from
``--ramp-up-start-rps`` to ``--ramp-up-end-rps``) request ``i`` of ``n`` gets its own rate — the
start rate moved by ``i / (n − 1)`` of the way to the end rate, linearly or geometrically — and
its gap is drawn at that rate; the cumulated gaps are not rescaled.
"""

from __future__ import annotations

import math

import numpy as np

RAMP_UP_STRATEGIES = ("linear", "exponential")


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


def ramp_up_rates(n: int, strategy: str, start_rps: float, end_rps: float) -> np.ndarray:
    """The rate of each of ``n`` requests under a ramp-up (vllm bench's
    ``_get_current_request_rate``)."""
    progress = np.arange(n, dtype=np.float64) / max(n - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * progress
    if strategy == "exponential":
        return start_rps * (end_rps / start_rps) ** progress
    raise ValueError(f"unknown ramp-up strategy {strategy!r}; valid: {RAMP_UP_STRATEGIES}")


def ramp_up_send_times(n: int, strategy: str, start_rps: float, end_rps: float,
                       burstiness: float, seed: int) -> np.ndarray:
    """Send times of ``n`` requests whose rate ramps from ``start_rps`` to ``end_rps``."""
    rates = ramp_up_rates(n, strategy, start_rps, end_rps)
    if math.isinf(burstiness):
        gaps = 1.0 / rates
    else:
        # one standard-gamma draw per request, scaled by its own rate: the draws vllm bench's
        # per-request np.random.gamma(shape, scale) calls make from the same seeded stream
        gaps = np.random.RandomState(seed).standard_gamma(burstiness, size=n) / (
            rates * burstiness
        )
    return np.cumsum(gaps)
