"""Aggregates exactly as ``vllm bench serve`` computes them, also for weighted (run-length) data.

``vllm bench serve`` reports ``numpy.mean``, ``numpy.median``, ``numpy.std`` (population) and
``numpy.percentile`` (linear interpolation, Hyndman & Fan method 7) of per-request values, and of
the pooled inter-token latencies. A million requests of ~200 tokens each pool ~2·10⁸ ITLs, too
many to expand, but they take few distinct values: every gap inside a token run is the gap
between two consecutive steps' delivery times. So ITLs are kept as ``(value, integer weight)``
pairs and this module computes the statistics of the *expanded* array without expanding it:

* percentiles are bit-for-bit ``numpy.percentile`` of the expansion (same virtual index, same
  neighbours, same ``_lerp`` formula);
* the median is bit-for-bit ``numpy.median`` (the mean of the two middle values for an even
  count);
* mean and standard deviation equal numpy's up to floating-point summation order
  (~1e-15 relative).

An empty input gives 0.0 for every statistic, as vllm's ``np.mean(values or 0)`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: vllm bench's defaults: ``--metric-percentiles 99``, ``--percentile-metrics ttft,tpot,itl``.
DEFAULT_PERCENTILES: tuple[float, ...] = (99.0,)
DEFAULT_PERCENTILE_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl")
#: The metrics ``summarize`` can report percentiles for.
PERCENTILE_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
#: vllm's ``MILLISECONDS_TO_SECONDS_CONVERSION``
MS_PER_S = 1000
#: (printed name, section header) of each percentile metric, in vllm's order
METRIC_TITLES: dict[str, tuple[str, str]] = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


@dataclass(frozen=True, slots=True)
class Describe:
    """mean / median / population std / selected percentiles of one metric (input units)."""

    count: int  # number of (expanded) values
    mean: float
    median: float
    std: float
    percentiles: tuple[tuple[float, float], ...]  # (p, value) in the order asked


def percentile_word(p: float) -> str:
    """vllm's key spelling of a percentile: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def _lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's ``_lerp`` (numpy/lib/_function_base_impl.py), operation for operation."""
    diff_b_a = np.subtract(b, a)
    out = np.asanyarray(np.add(a, diff_b_a * t))
    np.subtract(b, diff_b_a * (1 - t), out=out, where=t >= 0.5, casting="unsafe")
    return np.asarray(out, dtype=np.float64)


def _virtual_indexes(
    n: int, percentiles: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """numpy's linear-method virtual indexes and their (previous, next) neighbours."""
    q = np.true_divide(np.asarray(percentiles, dtype=np.float64), 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = n - 1
    nxt[above] = n - 1
    below = virtual < 0
    prev[below] = 0
    nxt[below] = 0
    return virtual, np.stack([prev, nxt]).astype(np.int64)


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray, percentiles: Sequence[float] | np.ndarray
) -> np.ndarray:
    """``numpy.percentile(np.repeat(values, weights), percentiles)`` without the repeat.

    ``weights`` are non-negative integers; values need not be sorted or distinct.
    """
    return _percentiles_sorted(*_sorted_cumulative(values, weights), percentiles)


def _percentiles_sorted(
    v: np.ndarray, cw: np.ndarray, percentiles: Sequence[float] | np.ndarray
) -> np.ndarray:
    n = int(cw[-1]) if len(cw) else 0
    if n == 0:
        return np.zeros(len(percentiles))
    virtual, (prev, nxt) = _virtual_indexes(n, percentiles)
    a = v[np.searchsorted(cw, prev, side="right")]
    b = v[np.searchsorted(cw, nxt, side="right")]
    gamma = virtual - np.floor(virtual)
    gamma[virtual >= n - 1] = 0.0  # numpy takes arr[-1] for both neighbours there
    gamma[virtual < 0] = 0.0
    return np.asarray(_lerp(a, b, gamma), dtype=np.float64)


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """``numpy.median(np.repeat(values, weights))``: the middle value, or the mean of the two."""
    return _median_sorted(*_sorted_cumulative(values, weights))


def _median_sorted(v: np.ndarray, cw: np.ndarray) -> float:
    n = int(cw[-1]) if len(cw) else 0
    if n == 0:
        return 0.0
    half = n // 2
    if n % 2 == 1:
        return float(v[np.searchsorted(cw, half, side="right")])
    pair = v[np.searchsorted(cw, np.array([half - 1, half]), side="right")]
    return float(np.mean(pair))


def weighted_mean_std(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Mean and population std of the expansion (numpy's ``mean``/``std`` defaults)."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.sum()
    if n == 0:
        return 0.0, 0.0
    v = np.asarray(values, dtype=np.float64)
    mean = float(np.dot(w, v) / n)
    dev = v - mean
    np.multiply(dev, dev, out=dev)  # squared in place: one array, not two
    return mean, float(np.sqrt(np.dot(w, dev) / n))


def _sorted_cumulative(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values with positive weight, sorted, and the cumulative weights (int64)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.int64)
    if len(v) != len(w):
        raise ValueError("values and weights must have the same length")
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    if (w == 1).all():  # plain data: a sort is enough
        return np.sort(v), np.arange(1, len(v) + 1, dtype=np.int64)
    keep = w > 0
    if not keep.all():  # (pooled ITLs have no zero weights: no copy for them)
        v, w = v[keep], w[keep]
    del keep
    order = np.argsort(v)  # ties may come in any order: the expansion is the same
    v, w = v[order], w[order]  # each sorted copy replaces its input (a long run's ITLs)
    del order
    return v, np.cumsum(w, out=w)


def describe(values: np.ndarray, percentiles: Sequence[float]) -> Describe:
    """vllm's aggregates of a plain array (``np.mean(values or 0)`` etc.)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return Describe(0, 0.0, 0.0, 0.0, tuple((float(p), 0.0) for p in percentiles))
    pct = np.percentile(x, list(percentiles)) if len(percentiles) else np.zeros(0)
    return Describe(
        len(x),
        float(np.mean(x)),
        float(np.median(x)),
        float(np.std(x)),
        tuple((float(p), float(val)) for p, val in zip(percentiles, pct, strict=True)),
    )


def describe_weighted(
    values: np.ndarray, weights: np.ndarray, percentiles: Sequence[float]
) -> Describe:
    """``describe(np.repeat(values, weights), percentiles)`` without the repeat."""
    count = int(np.asarray(weights, dtype=np.int64).sum())
    mean, std = weighted_mean_std(values, weights)
    v, cw = _sorted_cumulative(values, weights)
    pct = _percentiles_sorted(v, cw, percentiles)
    return Describe(
        count,
        mean,
        _median_sorted(v, cw),
        std,
        tuple((float(p), float(val)) for p, val in zip(percentiles, pct, strict=True)),
    )


def quantile_curve(
    values: np.ndarray,
    weights: np.ndarray | None = None,
    num_points: int = 512,
    percentiles: Sequence[float] = (),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, F) points of the empirical CDF for plotting (draw as steps, ``where="post"``), and
    the exact ``numpy.percentile`` of the data at ``percentiles`` (for markers).

    Up to ``num_points`` distinct values the CDF is exact: every value with the fraction of the
    (weighted) data at or below it. Beyond, it is ``num_points`` quantiles, so a
    million-request CDF plots as fast as a hundred-request one. NaNs are ignored. The data are
    sorted once for the curve and the percentiles.
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.ones(len(v), dtype=np.int64) if weights is None else np.asarray(weights)
    keep = ~np.isnan(v)
    xs, cw = _sorted_cumulative(v[keep], w[keep])
    if len(cw) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(len(percentiles))
    marks = _percentiles_sorted(xs, cw, percentiles)
    if len(xs) <= num_points:
        return xs, cw / cw[-1], marks
    probs = np.linspace(0.0, 100.0, num_points)
    return _percentiles_sorted(xs, cw, probs), probs / 100.0, marks


def _ms(value: float | None) -> str:
    """A latency as vllm prints it; "n/a" where no request gave one."""
    return "n/a" if value is None else f"{value:.2f}"


def format_summary(
    summary: Mapping[str, Any], metric_titles: Mapping[str, tuple[str, str]] = METRIC_TITLES
) -> str:
    """The "Serving Benchmark Result" block, line for line in vllm bench's layout: a run's
    summary, or a ``bench serve`` result (whose ``metric_titles`` add the client's queueing
    metrics). A percentile line is every ``p<number>_<metric>_ms`` field, in field order."""
    s = summary
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    add = lines.append
    add("{:<40} {:<10}".format("Successful requests:", s["completed"]))
    add("{:<40} {:<10}".format("Failed requests:", s["failed"]))
    if s.get("max_concurrency") is not None:
        add("{:<40} {:<10}".format("Maximum request concurrency:", s["max_concurrency"]))
    if s.get("request_rate") not in ("inf", None):
        add("{:<40} {:<10.2f}".format("Request rate configured (RPS):", s["request_rate"]))
    add("{:<40} {:<10.2f}".format("Benchmark duration (s):", s["duration"]))
    add("{:<40} {:<10}".format("Total input tokens:", s["total_input_tokens"]))
    add("{:<40} {:<10}".format("Total generated tokens:", s["total_output_tokens"]))
    add("{:<40} {:<10.2f}".format("Request throughput (req/s):", s["request_throughput"]))
    if s.get("request_goodput") is not None:
        add("{:<40} {:<10.2f}".format("Request goodput (req/s):", s["request_goodput"]))
    add("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", s["output_throughput"]))
    add("{:<40} {:<10.2f}".format(
        "Peak output token throughput (tok/s):", s["max_output_tokens_per_s"]))
    add("{:<40} {:<10.2f}".format("Peak concurrent requests:", s["max_concurrent_requests"]))
    add("{:<40} {:<10.2f}".format(
        "Total token throughput (tok/s):", s["total_token_throughput"]))
    for key, (name, header) in metric_titles.items():
        if f"mean_{key}_ms" not in s:
            continue
        add("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        add("{:<40} {:<10}".format(f"Mean {name} (ms):", _ms(s[f"mean_{key}_ms"])))
        add("{:<40} {:<10}".format(f"Median {name} (ms):", _ms(s[f"median_{key}_ms"])))
        suffix = f"_{key}_ms"
        for field, value in s.items():
            word = field[1 : -len(suffix)] if field.endswith(suffix) else ""
            if field.startswith("p") and _is_number(word):
                add("{:<40} {:<10}".format(f"P{word} {name} (ms):", _ms(value)))
    lines.append("=" * 50)
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
