"""Waking a SimPy process at an exact time, whatever time it is woken from.

SimPy's ``env.timeout(delay)`` fires at ``env.now + delay``. A process that means to wake at
time ``t`` asks for ``t - env.now``, and in floating point ``now + (t - now)`` is not always
``t`` (for 3% of random pairs it is one unit in the last place off, and for some pairs no
delay at all gives ``t`` back). A process's times would then depend on *when it last woke*:
an engine that paused at one more horizon (another replica's arrival, say) could run a step
one ulp later. ``wake_at`` schedules the event at ``t`` itself, so every simulated time is a
function of the run's inputs only — which is what lets a data-parallel run be split over
processes and give the single process's records bit for bit (``sim/fleet.py``).

Not compiled: the event subclasses SimPy's (a Python class), and mypyc builds native classes.
"""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import NORMAL


class WakeAt(simpy.Event):
    """An event that fires at exactly ``time_s`` (which must not lie in the past).

    It is built as SimPy builds a ``Timeout`` (triggered at creation, value None), but is
    queued at ``time_s`` instead of ``env.now + delay``. SimPy is pinned (pyproject.toml): the
    queue layout this relies on is tested in ``tests/sim/test_clock.py``.
    """

    def __init__(self, env: simpy.Environment, time_s: float) -> None:
        if time_s < env.now:
            raise ValueError(f"cannot wake at {time_s!r}: the clock is at {env.now!r}")
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        heappush(env._queue, (time_s, NORMAL, next(env._eid), self))


def wake_at(env: simpy.Environment, time_s: float) -> simpy.Event:
    """An event that fires at exactly ``time_s`` (>= ``env.now``)."""
    return WakeAt(env, time_s)
