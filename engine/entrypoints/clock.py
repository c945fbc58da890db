"""The run's clock: one time base for every process of a server.

All processes read ``CLOCK_MONOTONIC`` (system-wide on Linux: the same value in every process
at the same instant) minus the origin the launcher chose when it started, so stage records
written by API servers and by the EngineCore line up without any exchange of clock offsets.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def monotonic_s() -> float:
    """The system-wide monotonic clock, in seconds."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def run_clock(origin_s: float) -> Callable[[], float]:
    """Seconds since ``origin_s`` (a ``monotonic_s()`` reading)."""

    def clock() -> float:
        return time.clock_gettime(time.CLOCK_MONOTONIC) - origin_s

    return clock
