"""Capacity search: the highest request rate at which a layout still meets its SLOs.

The simulated SLO attainment is noisy in the seed, so every rate is *probed* with several seeds
(``RateProbe``). The rule is conservative — a rate is feasible only when every seed meets the
attainment target (a lower bound over the seeds, not their mean) — and noise-aware: rates where
the seeds disagree are kept and reported as the noise band, the range in which the answer
depends on the seed.

Search (``find_capacity``): probe ``rate_start``; multiply by ``growth`` (2 by default; the
planner starts at the cost model's capacity estimate, steps by 1.25 and squares the step after
each step in the same direction, ``accelerate``) while feasible (up to
``rate_max``: "unbounded"), or divide while infeasible (down to ``rate_min``: "infeasible", with
the best attainment seen); then bisect the bracket [highest feasible, lowest infeasible] until
its width is within ``tolerance`` of its lower end, or ``max_probes`` is reached.

A probe need not run every seed (``seeds_needed``): seeds run one after another and stop as
soon as a one-sided 95% Wilson bound on the pooled attainment settles the verdict — the lower
bound at or above the target (pass), or a seed below it (fail: the every-seed rule makes the
rate infeasible whatever the others do); only rates whose bound straddles the target pay for
more seeds.

Invariants: ``max_rate`` is a probed rate where every seed passed (0 when none did);
``fail_rate`` is a probed rate above it where some seed failed (inf when none did); with status
"ok", ``fail_rate − max_rate <= tolerance · max_rate`` unless ``max_probes`` stopped the search
(``converged`` False).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["pass", "fail", "mixed"]
Status = Literal["ok", "infeasible", "unbounded"]


@dataclass(frozen=True, slots=True)
class RateProbe:
    """One rate evaluated over several seeds."""

    rate: float  # offered request rate (req/s)
    attainments: tuple[float, ...]  # per seed: fraction of requests meeting every SLO
    target: float  # attainment a seed needs to pass

    def __post_init__(self) -> None:
        if not self.attainments:
            raise ValueError("a probe needs at least one seed")

    @property
    def num_passed(self) -> int:
        return sum(a >= self.target for a in self.attainments)

    @property
    def verdict(self) -> Verdict:
        n = self.num_passed
        if n == len(self.attainments):
            return "pass"
        return "fail" if n == 0 else "mixed"

    @property
    def feasible(self) -> bool:
        return self.verdict == "pass"

    @property
    def min_attainment(self) -> float:
        return min(self.attainments)

    @property
    def mean_attainment(self) -> float:
        return sum(self.attainments) / len(self.attainments)


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How hard to look (rates in requests per second)."""

    rate_start: float = 1.0
    rate_min: float = 0.01
    rate_max: float = 10_000.0
    tolerance: float = 0.05  # stop when (fail_rate − max_rate) <= tolerance · max_rate
    max_probes: int = 30
    growth: float = 2.0  # bracketing step: rates are multiplied or divided by this
    accelerate: bool = False  # square the step after each step the same way (gallop)

    def __post_init__(self) -> None:
        if not 1 < self.growth <= 16:
            raise ValueError(f"growth must be in (1, 16], got {self.growth}")
        if not 0 < self.rate_min <= self.rate_start <= self.rate_max:
            raise ValueError("need 0 < rate_min <= rate_start <= rate_max, got "
                             f"{self.rate_min}, {self.rate_start}, {self.rate_max}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")
        if self.max_probes < 2:
            raise ValueError(f"max_probes must be >= 2, got {self.max_probes}")


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """The outcome of one search (see the module invariants)."""

    status: Status
    max_rate: float  # highest probed rate where every seed passed; 0 if infeasible
    fail_rate: float  # lowest probed rate above max_rate where a seed failed; inf if unbounded
    converged: bool  # the bracket reached the tolerance (or the search hit a rate limit)
    probes: tuple[RateProbe, ...]  # in the order they were made

    @property
    def noise_band(self) -> tuple[float, float] | None:
        """(lowest, highest) rate where the seeds disagreed, if any."""
        mixed = [p.rate for p in self.probes if p.verdict == "mixed"]
        return (min(mixed), max(mixed)) if mixed else None

    @property
    def relative_width(self) -> float:
        """(fail_rate − max_rate) / max_rate: the answer's resolution."""
        if self.max_rate <= 0 or math.isinf(self.fail_rate):
            return math.inf
        return (self.fail_rate - self.max_rate) / self.max_rate

    @property
    def best_probe(self) -> RateProbe:
        """The probe at ``max_rate``; when infeasible, the one with the best attainment."""
        at_max = [p for p in self.probes if p.rate == self.max_rate and p.feasible]
        if at_max:
            return at_max[-1]
        return max(self.probes, key=lambda p: (p.min_attainment, -p.rate))


def find_capacity(
    probe: Callable[[float], RateProbe], settings: SearchSettings | None = None
) -> CapacityResult:
    """The highest feasible rate by bracketing and bisection (see the module docstring)."""
    settings = settings if settings is not None else SearchSettings()
    probes: list[RateProbe] = []

    def run(rate: float) -> bool:
        p = probe(rate)
        probes.append(p)
        return p.feasible

    def done(status: Status, lo: float, hi: float, converged: bool) -> CapacityResult:
        return CapacityResult(status, lo, hi, converged, tuple(probes))

    rate = settings.rate_start
    step = settings.growth
    if run(rate):
        lo = rate
        while True:
            if lo >= settings.rate_max:
                return done("unbounded", lo, math.inf, True)
            nxt = min(step * lo, settings.rate_max)
            step = step * step if settings.accelerate else step
            if len(probes) >= settings.max_probes:
                return done("unbounded", lo, math.inf, False)
            if not run(nxt):
                hi = nxt
                break
            lo = nxt
    else:
        hi = rate
        while True:
            if hi <= settings.rate_min:
                return done("infeasible", 0.0, hi, True)
            nxt = max(hi / step, settings.rate_min)
            step = step * step if settings.accelerate else step
            if len(probes) >= settings.max_probes:
                return done("infeasible", 0.0, hi, False)
            if run(nxt):
                lo = nxt
                break
            hi = nxt
    while hi - lo > settings.tolerance * lo:
        if len(probes) >= settings.max_probes:
            return done("ok", lo, hi, False)
        mid = (lo + hi) / 2
        if run(mid):
            lo = mid
        else:
            hi = mid
    return done("ok", lo, hi, True)



#: z of a one-sided 95% bound.
Z95_ONE_SIDED = 1.644854


def wilson_interval(successes: float, n: float,
                    z: float = Z95_ONE_SIDED) -> tuple[float, float]:
    """The Wilson score interval of a proportion (``successes`` of ``n``)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def seeds_needed(attainments: list[float], num_requests: list[int], target: float) -> bool:
    """Whether another seed is needed: every seed so far met ``target`` (one that did not
    makes the rate infeasible under the every-seed rule, whatever the others do) but the
    pooled attainment's one-sided 95% lower bound is still below it."""
    if any(a < target for a in attainments):
        return False
    n = sum(num_requests)
    met = sum(a * k for a, k in zip(attainments, num_requests, strict=True))
    lo, _ = wilson_interval(met, n)
    return lo < target
