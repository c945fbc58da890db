"""Non-negative least squares (Lawson–Hanson), numpy only: the fitted cost model's solver.

``nnls(A, b)`` minimises ‖Ax − b‖ subject to x ≥ 0 by the active-set method; ``fit_nonnegative``
weights the rows first (relative error: each row divided by its target).
"""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """``argmin ||a x − b||₂ subject to x >= 0`` (Lawson & Hanson's active-set algorithm).

    Columns should be scaled to comparable norms by the caller for a well-conditioned solve.
    Every iterate is feasible; after ``max_iter`` passes (10·n by default; never reached on
    well-posed problems) the current iterate is returned.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = a.shape
    if b.shape != (m,):
        raise ValueError(f"b must have shape ({m},), got {b.shape}")
    max_iter = 10 * n + 10 if max_iter is None else max_iter
    tol = 10 * np.finfo(np.float64).eps * max(m, n) * max(1.0, float(np.abs(a).sum(0).max()))
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    it = 0
    while (~passive).any() and it < max_iter:
        candidates = np.where(passive, -np.inf, w)
        j = int(np.argmax(candidates))
        if candidates[j] <= tol:
            break
        passive[j] = True
        s = _solve_passive(a, b, passive)
        while passive.any() and s[passive].min() <= 0.0 and it < max_iter:
            it += 1
            bad = passive & (s <= 0.0)
            alpha = float(np.min(x[bad] / (x[bad] - s[bad])))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            s = _solve_passive(a, b, passive)
        it += 1
        if not passive[j]:  # j could not enter (rounding): stop rather than cycle
            w = a.T @ (b - a @ s)
            x = s
            break
        x = s
        w = a.T @ (b - a @ x)
    return x


def _solve_passive(a: np.ndarray, b: np.ndarray, passive: np.ndarray) -> np.ndarray:
    s = np.zeros(a.shape[1])
    if passive.any():
        s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
    return s


def fit_nonnegative(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """NNLS of ``weights·(x c − y)`` with column scaling; ``c >= 0`` in ``x``'s units."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(x / scale * weights[:, None], y * weights)
    result: np.ndarray = coef / scale
    return result
