"""Capacity search: the bracketing/bisection rule on hand-made probe functions, then the full
plan against a synthetic cost model whose capacity is known in closed form."""

from __future__ import annotations

import math

import pytest

from experiments.plan.capacity import RateProbe, SearchSettings, find_capacity
from experiments.plan.planner import PlanSpec, run_plan
from experiments.plan.report import plan_rows
from experiments.sweep.backends import InlineBackend
from experiments.sweep.runner import ResultCache
from tests.experiments.helpers import ConstantStepCostModel, analytic_base, analytic_capacity


def _threshold_probe(capacity: float, noise: float = 0.0, seeds: int = 3):  # type: ignore[no-untyped-def]
    """Seed i passes iff rate ≤ capacity · (1 + noise · (i − 1)): seeds disagree in a band."""
    calls: list[float] = []

    def probe(rate: float) -> RateProbe:
        calls.append(rate)
        att = tuple(1.0 if rate <= capacity * (1 + noise * (i - 1)) else 0.5
                    for i in range(seeds))
        return RateProbe(rate, att, 0.99)

    return probe, calls


def test_finds_a_step_threshold_within_tolerance() -> None:
    probe, calls = _threshold_probe(7.3)
    res = find_capacity(probe, SearchSettings(rate_start=1.0, tolerance=0.02))
    assert res.status == "ok" and res.converged
    assert res.max_rate <= 7.3 < res.fail_rate
    assert res.fail_rate - res.max_rate <= 0.02 * res.max_rate
    assert res.noise_band is None
    assert calls[:4] == [1.0, 2.0, 4.0, 8.0]  # doubling brackets, then bisection
    assert res.best_probe.rate == res.max_rate and res.best_probe.feasible


def test_search_downward_from_an_infeasible_start() -> None:
    probe, _ = _threshold_probe(0.3)
    res = find_capacity(probe, SearchSettings(rate_start=5.0, tolerance=0.05))
    assert res.status == "ok" and res.max_rate <= 0.3 < res.fail_rate
    assert res.relative_width <= 0.05


def test_seed_disagreement_is_conservative_and_reported() -> None:
    probe, _ = _threshold_probe(10.0, noise=0.1)  # seeds pass up to 9, 10, 11 req/s
    res = find_capacity(probe, SearchSettings(rate_start=1.0, tolerance=0.01))
    assert res.max_rate <= 9.0 < res.fail_rate  # every seed must pass: the worst seed rules
    band = res.noise_band
    assert band is not None and 9.0 < band[0] <= band[1] <= 11.0
    assert any(p.verdict == "mixed" for p in res.probes)


def test_infeasible_unbounded_and_probe_budget() -> None:
    probe, _ = _threshold_probe(0.001)
    res = find_capacity(probe, SearchSettings(rate_start=1.0, rate_min=0.1))
    assert res.status == "infeasible" and res.max_rate == 0.0
    assert min(p.rate for p in res.probes) == pytest.approx(0.1)
    probe, _ = _threshold_probe(1e9)
    res = find_capacity(probe, SearchSettings(rate_start=1.0, rate_max=50.0))
    assert res.status == "unbounded" and res.max_rate == 50.0 and math.isinf(res.fail_rate)
    probe, calls = _threshold_probe(7.3)
    res = find_capacity(probe, SearchSettings(rate_start=1.0, tolerance=1e-6, max_probes=6))
    assert len(calls) == 6 and not res.converged and res.status == "ok"
    assert res.max_rate <= 7.3 < res.fail_rate


STEP_S, OUTPUT_LEN, N = 0.01, 10, 100  # one replica serves 1 / (10 × 10 ms) = 10 req/s


def _plan(**kw: object) -> tuple[PlanSpec, list, object]:  # type: ignore[type-arg]
    defaults: dict[str, object] = dict(
        base=analytic_base(N, OUTPUT_LEN), gpus=("h100-sxm",), slos_ms={"ttft": 50.0},
        attainment=0.99, seeds=(0,),
        search=SearchSettings(rate_start=2.0, rate_min=0.5, rate_max=200.0, tolerance=0.01),
    )
    defaults.update(kw)
    spec = PlanSpec(**defaults)  # type: ignore[arg-type]
    outcomes, ev = run_plan(spec, InlineBackend(), ResultCache(None),
                            cost_model_factory=lambda cfg: ConstantStepCostModel(STEP_S))
    return spec, outcomes, ev


def test_capacity_matches_the_closed_form() -> None:
    expected = analytic_capacity(STEP_S, OUTPUT_LEN, N, 0.050, 0.99)
    assert 10.0 < expected < 10.05
    spec, (outcome,), ev = _plan()
    cap = outcome.capacity
    assert cap.status == "ok" and cap.converged
    assert cap.max_rate <= expected < cap.fail_rate
    assert cap.max_rate >= expected / (1 + spec.search.tolerance)
    row = plan_rows(spec, ev, [outcome]).iloc[0]
    assert row["status"] == "ok" and row["num_gpus"] == 1
    assert row["gpu_hours_per_million_requests"] == pytest.approx(1e6 / (cap.max_rate * 3600))


def test_fewest_replicas_for_a_target_rate() -> None:
    # 25 req/s evenly spaced, round robin: 2 replicas see 12.5 req/s each (> 10), 3 see 8.3.
    spec, (outcome,), ev = _plan(target_rate=25.0, tp_sizes=(2,), gpu_prices={"h100-sxm": 2.0})
    assert outcome.replicas == 3 and outcome.target_status == "ok"
    row = plan_rows(spec, ev, [outcome]).iloc[0]
    assert row["num_gpus"] == 6 and row["replicas"] == 3 and row["status"] == "ok"
    assert row["usd_per_million_requests"] == pytest.approx(6 / (25 * 3600) * 1e6 * 2.0)


def test_unmeetable_slo_gives_an_infeasible_row_not_a_crash() -> None:
    # TTFT is at least one 10 ms step: a 5 ms SLO is never met.
    spec, outcomes, ev = _plan(slos_ms={"ttft": 5.0}, gpus=("h100-sxm", "a100-80gb"),
                               target_rate=5.0)
    df = plan_rows(spec, ev, outcomes)
    assert list(df["status"]) == ["infeasible", "infeasible"]
    assert (df["attainment"] == 0.0).all()
    assert df["note"].str.contains("infeasible: ttft:5ms").all()
    assert df["note"].str.contains("best attainment 0.0%").all()


def test_a_layout_that_does_not_fit_is_an_invalid_row() -> None:
    base = analytic_base(N, OUTPUT_LEN)
    base["model"] = "meta-llama/Llama-3.1-70B"
    del base["num_gpu_blocks"]
    spec, outcomes, ev = _plan(base=base, gpus=("a100-80gb",), tp_sizes=(1,))
    df = plan_rows(spec, ev, outcomes)
    assert df.loc[0, "status"] == "invalid" and "does not fit" in df.loc[0, "note"]
