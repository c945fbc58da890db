"""Service-level objectives a request carries: its SLO class and tenant.

A workload may give each request a *tenant* (who sent it) and an *SLO class* (the latency
targets it is served under). Both worlds copy them onto the core's ``Request``; policies read
them (earliest deadline first, fair share per tenant, load shedding), and the event records and
reports break results down by them. A class without a target for a metric has ``math.inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.core.errors import UserError


@dataclass(frozen=True, slots=True)
class SLOClass:
    """A named class of requests sharing latency targets (seconds; inf: no target).

    Invariant: the name is a non-empty string; each target is > 0 (or inf).
    """

    name: str  # e.g. "interactive", "batch"
    ttft_s: float = math.inf  # time to first token, client side
    tpot_s: float = math.inf  # time per output token after the first

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise UserError(f"an SLO class needs a non-empty name, got {self.name!r}")
        for what, value in (("ttft", self.ttft_s), ("tpot", self.tpot_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise UserError(
                    f"SLO class {self.name!r}: the {what} target must be a number > 0 "
                    f"(or inf), got {value!r}"
                )

    @classmethod
    def from_ms(cls, name: str, ttft_ms: float, tpot_ms: float) -> SLOClass:
        """A class from targets in milliseconds, as workload files give them."""
        for what, value in (("ttft", ttft_ms), ("tpot", tpot_ms)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UserError(
                    f"SLO class {name!r}: the {what} target must be a number of ms, got "
                    f"{value!r}"
                )
        return cls(name, ttft_ms / 1000.0, tpot_ms / 1000.0)

    @property
    def has_targets(self) -> bool:
        return math.isfinite(self.ttft_s) or math.isfinite(self.tpot_s)
