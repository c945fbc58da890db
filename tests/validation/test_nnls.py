"""``sim.cost.fitted.nnls``: Lawson–Hanson non-negative least squares, checked against its
optimality (KKT) conditions and a brute-force search over active sets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost.nnls import fit_nonnegative, nnls


def brute_force(a: np.ndarray, b: np.ndarray) -> float:
    """Smallest ||a x − b||² over x >= 0: least squares on every support, kept if feasible."""
    n = a.shape[1]
    best = float(b @ b)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            x = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if (x >= -1e-12).all():
                r = a[:, cols] @ x - b
                best = min(best, float(r @ r))
    return best


def test_recovers_an_exact_nonnegative_solution() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(40, 6))
    x_true = np.array([0.5, 0.0, 2.0, 0.0, 1.25, 3.0])
    x = nnls(a, a @ x_true)
    np.testing.assert_allclose(x, x_true, atol=1e-10)


def test_clips_a_negative_unconstrained_solution_to_zero() -> None:
    a = np.eye(3)
    x = nnls(a, np.array([1.0, -2.0, 3.0]))
    np.testing.assert_allclose(x, [1.0, 0.0, 3.0])


def test_rejects_a_mismatched_right_hand_side() -> None:
    with pytest.raises(ValueError, match="shape"):
        nnls(np.eye(3), np.ones(4))


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 8),
    n=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_kkt_conditions_and_brute_force_optimum(m: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, n))
    b = rng.normal(size=m)
    x = nnls(a, b)
    assert (x >= 0).all()
    w = a.T @ (b - a @ x)  # minus the gradient of ½||ax − b||²
    scale = 1e-8 * max(1.0, float(np.abs(a).sum()) * float(np.abs(b).sum()))
    assert (w <= scale).all()
    assert (np.abs(w[x > 0]) <= scale).all()
    r = a @ x - b
    assert float(r @ r) <= brute_force(a, b) + 1e-9 * max(1.0, float(b @ b))


def test_column_scaling_keeps_coefficients_in_input_units() -> None:
    rng = np.random.default_rng(2)
    x = np.column_stack([np.ones(30), rng.uniform(1, 100, 30), rng.uniform(1e9, 1e12, 30)])
    c_true = np.array([3e-3, 5e-4, 2e-13])
    c = fit_nonnegative(x, x @ c_true, np.ones(30))
    np.testing.assert_allclose(c, c_true, rtol=1e-8)
