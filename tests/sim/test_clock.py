"""``sim/clock.py``: a process woken at ``t`` sees exactly ``t``, whenever it went to sleep."""

from __future__ import annotations

from collections.abc import Generator

import pytest
import simpy

from sim.clock import wake_at

#: A pair for which no delay d gives now + d == t in floating point (so SimPy's timeouts
#: cannot wake a process at t from now).
NOW, T = 751548.9990144776, 1938752.366230467


def test_no_timeout_reaches_this_time() -> None:
    d = T - NOW
    assert NOW + d != T
    assert all(NOW + (d + k * 2.0**-33) != T for k in range(-4, 5))


def test_wake_at_fires_at_exactly_the_time_asked() -> None:
    env = simpy.Environment(initial_time=NOW)
    seen: list[float] = []

    def sleeper() -> Generator[simpy.Event, object, None]:
        value = yield wake_at(env, T)
        seen.append(env.now)
        assert value is None
        yield wake_at(env, env.now)  # "now" is allowed: fires at once
        seen.append(env.now)

    env.process(sleeper())
    env.run()
    assert seen == [T, T]


def test_wake_at_keeps_simpy_order_with_timeouts() -> None:
    env = simpy.Environment()
    order: list[str] = []

    def proc(name: str, event: simpy.Event) -> Generator[simpy.Event, object, None]:
        yield event
        order.append(f"{name}@{env.now}")

    env.process(proc("timeout-2", env.timeout(2.0)))
    env.process(proc("at-1", wake_at(env, 1.0)))
    env.process(proc("at-2", wake_at(env, 2.0)))  # same time: scheduled later, fires later
    env.process(proc("either", wake_at(env, 3.0) | env.timeout(0.5)))
    env.run()
    assert order == ["either@0.5", "at-1@1.0", "timeout-2@2.0", "at-2@2.0"]


def test_wake_at_refuses_the_past() -> None:
    env = simpy.Environment(initial_time=5.0)
    with pytest.raises(ValueError, match=r"clock is at 5\.0"):
        wake_at(env, 4.0)
