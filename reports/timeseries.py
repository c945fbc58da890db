"""Per-step columns binned over time, so a plot of 300,000 steps draws ≤ ``MAX_BINS`` points.

Bins are equal-width over the steps' update times (when each step's state was recorded). Each
bin gives the mean and the max of a column over the steps in it, or NaN when it holds none
(the engine was idle): plots show gaps there instead of invented values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_BINS = 2000


@dataclass(frozen=True, slots=True)
class Binned:
    """Binned per-step columns."""

    time_s: np.ndarray  # bin centres, seconds since the first step
    count: np.ndarray  # steps per bin
    mean: dict[str, np.ndarray]  # column -> mean over the bin's steps (NaN if empty)
    max: dict[str, np.ndarray]  # column -> max over the bin's steps (NaN if empty)
    total: dict[str, np.ndarray]  # column -> sum over the bin's steps
    width_s: float  # bin width


def bin_steps(
    steps: pd.DataFrame, columns: Sequence[str], max_bins: int = MAX_BINS
) -> Binned:
    """Mean/max/sum of ``columns`` per time bin (see the module docstring)."""
    t = steps["update_time_s"].to_numpy(dtype=np.float64)
    if len(t) == 0:
        empty = {c: np.zeros(0) for c in columns}
        return Binned(np.zeros(0), np.zeros(0, dtype=np.int64), empty, empty, empty, 0.0)
    t0, t1 = float(t.min()), float(t.max())
    nb = max(1, min(max_bins, len(t)))
    width = (t1 - t0) / nb if t1 > t0 else 1.0
    idx = np.minimum(((t - t0) / width).astype(np.int64), nb - 1)
    count = np.bincount(idx, minlength=nb)
    empty_bin = count == 0
    means, maxes, totals = {}, {}, {}
    for c in columns:
        x = steps[c].to_numpy(dtype=np.float64)
        total = np.bincount(idx, weights=x, minlength=nb)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / count
        mx = np.full(nb, -np.inf)
        np.maximum.at(mx, idx, x)
        mean[empty_bin] = np.nan
        mx[empty_bin] = np.nan
        means[c], maxes[c], totals[c] = mean, mx, total
    centres = (np.arange(nb) + 0.5) * width
    return Binned(centres, count, means, maxes, totals, width)
