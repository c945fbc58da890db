"""The weighted statistics equal numpy's on the expanded array (percentiles and median bit for
bit), and the plain ones follow vllm's ``np.mean(values or 0)`` conventions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.stats import (
    describe,
    describe_weighted,
    percentile_word,
    quantile_curve,
    weighted_mean_std,
    weighted_median,
    weighted_percentiles,
)

values_and_weights = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=64), min_size=n, max_size=n),
        st.lists(st.integers(0, 50), min_size=n, max_size=n),
    )
).filter(lambda vw: sum(vw[1]) > 0)
percentile_lists = st.lists(
    st.one_of(st.floats(0, 100), st.sampled_from([0.0, 50.0, 90.0, 99.0, 99.9, 100.0])),
    min_size=1, max_size=8,
)


@settings(max_examples=250, deadline=None)
@given(values_and_weights, percentile_lists)
def test_weighted_percentiles_equal_numpy_exactly(vw, percentiles):
    values, weights = np.array(vw[0]), np.array(vw[1])
    expanded = np.repeat(values, weights)
    got = weighted_percentiles(values, weights, percentiles)
    want = np.percentile(expanded, percentiles)
    assert got.tolist() == want.tolist()


@settings(max_examples=150, deadline=None)
@given(values_and_weights)
def test_weighted_median_equals_numpy_exactly(vw):
    values, weights = np.array(vw[0]), np.array(vw[1])
    assert weighted_median(values, weights) == float(np.median(np.repeat(values, weights)))


@settings(max_examples=100, deadline=None)
@given(values_and_weights)
def test_weighted_mean_std_match_numpy(vw):
    values, weights = np.array(vw[0]), np.array(vw[1])
    expanded = np.repeat(values, weights)
    mean, std = weighted_mean_std(values, weights)
    assert mean == pytest.approx(float(np.mean(expanded)), rel=1e-9, abs=1e-6)
    assert std == pytest.approx(float(np.std(expanded)), rel=1e-7, abs=1e-6)


def test_describe_weighted_matches_describe_of_expansion():
    rng = np.random.default_rng(0)
    values = rng.exponential(0.01, 500)
    weights = rng.integers(0, 30, 500)
    a = describe_weighted(values, weights, [50, 90, 99, 99.9])
    b = describe(np.repeat(values, weights), [50, 90, 99, 99.9])
    assert a.count == b.count
    assert a.median == b.median
    assert a.percentiles == b.percentiles
    assert a.mean == pytest.approx(b.mean, rel=1e-12)
    assert a.std == pytest.approx(b.std, rel=1e-9)


def test_empty_inputs_give_zero_like_vllm():
    d = describe(np.zeros(0), [99])
    assert (d.count, d.mean, d.median, d.std, d.percentiles) == (0, 0.0, 0.0, 0.0, ((99.0, 0.0),))
    w = describe_weighted(np.array([1.0]), np.array([0]), [50])
    assert (w.mean, w.median, w.percentiles) == (0.0, 0.0, ((50.0, 0.0),))


def test_bad_weights_are_rejected():
    with pytest.raises(ValueError):
        weighted_percentiles(np.array([1.0]), np.array([-1]), [50])
    with pytest.raises(ValueError):
        weighted_percentiles(np.array([1.0, 2.0]), np.array([1]), [50])


def test_percentile_words_follow_vllm():
    assert [percentile_word(p) for p in (99, 99.0, 99.9, 50, 0.5)] == [
        "99", "99", "99.9", "50", "0.5"
    ]


def test_quantile_curve_is_bounded_and_exact_when_small():
    x = np.random.default_rng(1).normal(size=100_000)
    xs, f, marks = quantile_curve(x, percentiles=(50.0, 99.0))
    assert len(xs) == 512 and np.all(np.diff(f) > 0) and f[0] == 0 and f[-1] == 1
    assert marks.tolist() == np.percentile(x, [50, 99]).tolist()
    xs, f, _ = quantile_curve(np.array([3.0, 1.0, np.nan, 2.0]))
    assert xs.tolist() == [1.0, 2.0, 3.0] and f.tolist() == [1 / 3, 2 / 3, 1.0]
    xs, f, marks = quantile_curve(np.array([2.0, 1.0]), np.array([3, 1]), percentiles=[50])
    assert xs.tolist() == [1.0, 2.0] and f.tolist() == [0.25, 1.0] and marks.tolist() == [2.0]
    assert len(quantile_curve(np.zeros(0))[0]) == 0
