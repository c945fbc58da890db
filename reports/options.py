"""Parsing of the report options, spelled as ``vllm bench serve`` spells them.

* ``--goodput ttft:500 tpot:50 e2el:2000`` — ``KEY:VALUE`` pairs, keys ``ttft``/``tpot``/
  ``e2el``, values in ms, positive (vllm's ``parse_goodput`` + ``check_goodput_args``, which also
  accept 0: a limit no request can meet);
* ``--metric-percentiles 50,90,99`` — comma-separated floats in [0, 100];
* ``--percentile-metrics ttft,tpot,itl,e2el`` — comma-separated metric names.

Bad input raises ``ReportError`` with a one-line message that says what is valid.
``SummaryOptions`` holds the three, parsed: what a run's summary reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from reports.errors import ReportError
from reports.stats import (
    DEFAULT_PERCENTILE_METRICS,
    DEFAULT_PERCENTILES,
    PERCENTILE_METRICS,
)

GOODPUT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")


def parse_goodput(pairs: Iterable[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (ms)."""
    out: dict[str, float] = {}
    for pair in pairs or ():
        try:
            name, value = pair.split(":")
            if name in out:
                raise ReportError(f"goodput SLO {name!r} given twice ({pair!r})")
            out[name] = float(value)
        except ReportError:
            raise
        except ValueError as err:
            raise ReportError(
                f"invalid goodput SLO {pair!r}: give KEY:VALUE pairs such as ttft:500, where "
                f"KEY is one of {', '.join(GOODPUT_METRICS)} and VALUE is in milliseconds"
            ) from err
    check_goodput(out)
    return out


def check_goodput(goodput: Mapping[str, float] | None) -> None:
    """Reject unknown SLO names and negative or non-finite values."""
    for name, value in (goodput or {}).items():
        if name not in GOODPUT_METRICS:
            raise ReportError(
                f"invalid goodput metric {name!r}: valid names are {', '.join(GOODPUT_METRICS)}"
            )
        if not (value > 0 and math.isfinite(value)):
            raise ReportError(
                f"invalid goodput value {name}:{value}: the SLO must be a positive number "
                "of milliseconds (no request meets a limit of 0 ms)"
            )


def parse_percentiles(text: str | Sequence[float]) -> list[float]:
    """``"50,90,99"`` -> ``[50.0, 90.0, 99.0]``."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[float] = []
    for item in items:
        try:
            p = float(item)
        except ValueError as err:
            raise ReportError(
                f"invalid percentile {item!r}: give comma-separated numbers such as 50,90,99"
            ) from err
        if not 0 <= p <= 100:
            raise ReportError(f"invalid percentile {p}: percentiles must lie in [0, 100]")
        out.append(p)
    if not out:
        raise ReportError("no percentiles given: use e.g. --metric-percentiles 50,90,99")
    return out


def parse_percentile_metrics(text: str | Sequence[str]) -> list[str]:
    """``"ttft,tpot"`` -> ``["ttft", "tpot"]`` (names checked)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [m.strip() for m in items if m.strip()]
    for m in names:
        if m not in PERCENTILE_METRICS:
            raise ReportError(
                f"invalid percentile metric {m!r}: valid names are {', '.join(PERCENTILE_METRICS)}"
            )
    if not names:
        raise ReportError("no percentile metrics given: use e.g. --percentile-metrics ttft,tpot")
    return names


@dataclass(frozen=True, slots=True)
class SummaryOptions:
    """What a run's summary reports, as ``vllm bench serve``'s result flags set it."""

    goodput: Mapping[str, float] | None = None  # SLOs in ms, e.g. {"ttft": 500}; None: none
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES  # e.g. (50.0, 99.0)
    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS  # of ttft, tpot, itl, e2el

    @classmethod
    def parse(
        cls, goodput: Iterable[str] | None, percentiles: str, percentile_metrics: str
    ) -> SummaryOptions:
        """The options as the flags spell them (``--goodput``, ``--metric-percentiles``,
        ``--percentile-metrics``); a bad one is a ``ReportError``."""
        return cls(
            goodput=parse_goodput(goodput) if goodput else None,
            percentiles=tuple(parse_percentiles(percentiles)),
            percentile_metrics=tuple(parse_percentile_metrics(percentile_metrics)),
        )
