"""Interpolation of measured kernel tables: 1-D curves and 2-D grids (pure Python, compiled).

A ``Curve`` passes through measured points ``(x, y)``; between two points it is linear in
``x`` and ``y`` (``log_x=False``) or in ``log x`` and ``log y`` (``log_x=True``). Below the first
point it keeps the first value (a kernel never gets faster than its smallest measured input);
beyond the last it grows as ``y_last · (x / x_last) ** exponent`` (1: work proportional to
``x``, 2: quadratic, as causal prefill attention is in its length). Which form each table uses
is chosen on held-out grid lines (``sim/cost/calibration/kernels.py``).

A ``Grid`` holds one curve per row value (e.g. batch size) over a column axis (context length)
and interpolates linearly between rows, beyond the last row in proportion to it.
"""

from __future__ import annotations

import math


def bisect_right(xs: list[float], x: float) -> int:
    """The index of the first value of ``xs`` (sorted) above ``x``: ``bisect.bisect_right``'s
    algorithm, written out so that the compiled build runs it natively (the library call
    boxed ``x``, parsed its arguments and compared boxed floats: about 750 instructions a
    call, most of a curve lookup's cost)."""
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < xs[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def segment(xs: list[float], x: float, hint: int) -> int:
    """``bisect_right(xs, x)`` for an ``x`` strictly inside ``xs``'s range, trying the segment
    ``hint`` (the previous lookup's) first: consecutive lookups mostly fall in it."""
    if hint < len(xs) and xs[hint - 1] <= x < xs[hint]:
        return hint
    return bisect_right(xs, x)


class Curve:
    """A measured curve ``y(x)``: at least one point, ``xs`` strictly increasing, ``ys > 0``."""

    xs: list[float]
    ys: list[float]
    log_x: bool
    exponent: float
    _lx: list[float]
    _ly: list[float]
    _last: int  # the segment of the last lookup: consecutive lookups mostly fall in it

    def __init__(
        self, xs: list[float], ys: list[float], *, log_x: bool = False, exponent: float = 1.0
    ) -> None:
        if not xs or len(xs) != len(ys):
            raise ValueError("a curve needs as many y values as x values, at least one")
        for i in range(1, len(xs)):
            if not xs[i] > xs[i - 1]:
                raise ValueError(f"curve x values must increase, got {xs}")
        for x, y in zip(xs, ys, strict=True):
            if not (x > 0.0 and y > 0.0 and math.isfinite(y)):
                raise ValueError(f"curve points must be positive and finite, got ({x}, {y})")
        self.xs = list(xs)
        self.ys = list(ys)
        self.log_x = log_x
        self.exponent = exponent
        self._lx = [math.log(x) for x in xs]
        self._ly = [math.log(y) for y in ys]
        self._last = 1

    def at(self, x: float) -> float:
        """``y(x)``. The segment found is kept for the next call: a step's cost looks up
        contexts and batch sizes that change little from one step to the next, so the
        bisection is mostly skipped (the same segment, the same arithmetic)."""
        xs = self.xs
        n = len(xs)
        if x <= xs[0]:
            return self.ys[0]
        if x >= xs[n - 1]:
            ratio = x / xs[n - 1]
            if self.exponent == 1.0:
                return self.ys[n - 1] * ratio
            return self.ys[n - 1] * math.pow(ratio, self.exponent)
        j = self._last = segment(xs, x, self._last)
        x0, x1 = xs[j - 1], xs[j]
        if self.log_x:
            lx0 = self._lx[j - 1]
            w = (math.log(x) - lx0) / (self._lx[j] - lx0)
            return math.exp(self._ly[j - 1] + w * (self._ly[j] - self._ly[j - 1]))
        y0 = self.ys[j - 1]
        return y0 + (x - x0) / (x1 - x0) * (self.ys[j] - y0)


class Grid:
    """``z(row, x)``: one ``Curve`` per row value, linear between rows."""

    rows: list[float]
    curves: list[Curve]
    _last: int  # the row segment of the last lookup (as ``Curve._last``)

    def __init__(self, rows: list[float], curves: list[Curve]) -> None:
        if not rows or len(rows) != len(curves):
            raise ValueError("a grid needs one curve per row value, at least one")
        for i in range(1, len(rows)):
            if not rows[i] > rows[i - 1]:
                raise ValueError(f"grid row values must increase, got {rows}")
        self.rows = list(rows)
        self.curves = list(curves)
        self._last = 1

    def at(self, row: float, x: float) -> float:
        rows = self.rows
        n = len(rows)
        if row <= rows[0]:
            return self.curves[0].at(x)
        if row >= rows[n - 1]:
            return self.curves[n - 1].at(x) * (row / rows[n - 1])
        j = self._last = segment(rows, row, self._last)
        r0 = rows[j - 1]
        z0 = self.curves[j - 1].at(x)
        z1 = self.curves[j].at(x)
        return z0 + (row - r0) / (rows[j] - r0) * (z1 - z0)
