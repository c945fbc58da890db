"""The fitted cost model: coefficients recovered from synthetic profiles with known values,
exact decode fast path, held-out error, JSON round trip, front-end costs and their mapping."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import ConfigError
from engine.core.outputs import BatchShape
from sim.cost.fitted import (
    FEATURE_NAMES,
    FittedCostModel,
    FrontendCosts,
    IdleWakeup,
    ModelGeometry,
    ProfileRecord,
    read_profile_csv,
)

GEOMETRY = ModelGeometry(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                         intermediate_size=128, vocab_size=384, dtype_bytes=4)
#: Each term contributes a visible share of some rows' time (seconds per feature unit).
TRUE = {"step": 2e-3, "per_request": 3e-4, "linear_flops": 1.4e-10, "lm_head_flops": 2e-9,
        "prefill_attention_flops": 3e-10, "decode_kv_bytes": 1e-10}


def shape(prefills: list[tuple[int, int]], decodes: list[int], partial: int = 0) -> BatchShape:
    n = len(prefills) + len(decodes)
    return BatchShape(n, sum(q for q, _ in prefills) + len(decodes),
                      tuple(q for q, _ in prefills), tuple(c for _, c in prefills), len(decodes),
                      sum(decodes), max(decodes, default=0), n - partial)


def grid() -> list[tuple[str, BatchShape]]:
    rows = []
    for q in (16, 64, 256, 1024):
        for ctx in (0, 512):
            for b in (1, 3):
                rows.append(("prefill", shape([(q, ctx)] * b, [])))
        rows.append(("prefill", shape([(q, 0)], [], partial=1)))
    for n in (1, 2, 4, 16, 64, 128):
        for ctx in (16, 128, 512):
            rows.append(("decode", shape([], [ctx] * n)))
    for n in (1, 4, 16, 48):
        for q in (64, 256):
            rows.append(("mixed", shape([(q, 0)], [128] * n)))
    return rows


def records(coef: dict[str, float], knee: int = 0, noise: float = 0.0,
            seed: int = 0) -> list[ProfileRecord]:
    truth = FittedCostModel(GEOMETRY, coef, knee)
    rng = np.random.default_rng(seed)
    out = []
    for kind, s in grid():
        t = truth.step_time(s).total_s * (1.0 + noise * rng.standard_normal())
        out.append(ProfileRecord(kind, "step", s, s.num_tokens, 0, t, t, t, t, 3, 1.0))
    return out


def test_recovers_known_coefficients_from_an_exact_profile() -> None:
    model = FittedCostModel.fit(records(TRUE), GEOMETRY)
    for name in FEATURE_NAMES:
        assert model.coefficients[name] == pytest.approx(TRUE[name], rel=1e-6), name
    assert model.linear_knee_tokens == 0
    assert model.fit_report["holdout"]["median_abs_rel_err"] < 1e-9
    assert model.fit_report["holdout"]["num_rows"] == round(0.2 * len(grid()))


def test_recovers_the_weight_read_knee() -> None:
    model = FittedCostModel.fit(records(TRUE, knee=64), GEOMETRY,
                                knee_candidates=[0, 16, 64, 256])
    assert model.linear_knee_tokens == 64
    assert model.coefficients["linear_flops"] == pytest.approx(TRUE["linear_flops"], rel=1e-6)
    weight_read = model.to_json()["weight_read_s"]
    assert weight_read == pytest.approx(TRUE["linear_flops"] * 2 * GEOMETRY.linear_params * 64)


def test_noisy_profile_recovers_the_dominant_terms_and_reports_its_error() -> None:
    model = FittedCostModel.fit(records(TRUE, noise=0.03, seed=4), GEOMETRY,
                                knee_candidates=[0])
    for name in ("step", "per_request", "prefill_attention_flops", "decode_kv_bytes"):
        assert model.coefficients[name] == pytest.approx(TRUE[name], rel=0.2), name
    report = model.fit_report
    assert 0.0 < report["holdout"]["median_abs_rel_err"] < 0.06
    assert report["train"]["num_rows"] + report["holdout"]["num_rows"] == len(grid())
    assert set(report["holdout_by_kind"]) == {"prefill", "decode", "mixed"}
    assert report["statistic"] == "mean"


def test_coefficients_stay_nonnegative_when_a_feature_does_not_matter() -> None:
    coef = {**TRUE, "lm_head_flops": 0.0, "decode_kv_bytes": 0.0}
    model = FittedCostModel.fit(records(coef, noise=0.05, seed=1), GEOMETRY)
    assert all(c >= 0 for c in model.coefficients.values())


def test_fit_needs_enough_rows_and_a_known_statistic() -> None:
    with pytest.raises(ConfigError, match="at least"):
        FittedCostModel.fit(records(TRUE)[:3], GEOMETRY)
    with pytest.raises(ConfigError, match="statistic"):
        FittedCostModel.fit(records(TRUE), GEOMETRY, statistic="p90")


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 4096),
    ctx_sum=st.integers(0, 10**8),
    knee=st.integers(0, 512),
    coefs=st.lists(st.floats(0, 1e-2, allow_subnormal=False), min_size=6, max_size=6),
)
def test_decode_fast_path_is_bit_identical(n: int, ctx_sum: int, knee: int,
                                           coefs: list[float]) -> None:
    scaled = [c * s for c, s in zip(coefs, (1, 1, 1e-9, 1e-9, 1e-9, 1e-9), strict=True)]
    model = FittedCostModel(GEOMETRY, dict(zip(FEATURE_NAMES, scaled, strict=True)), knee)
    decode = BatchShape(n, n, (), (), n, ctx_sum, ctx_sum // n, n)
    assert model.decode_step_total(n, ctx_sum, ctx_sum // n) == model.step_time(decode).total_s


def test_step_time_breakdown_adds_up_and_empty_steps_cost_nothing() -> None:
    model = FittedCostModel(GEOMETRY, TRUE)
    t = model.step_time(shape([(128, 64)], [100, 200]))
    assert t.total_s == pytest.approx(t.linear_s + t.attention_s + t.overhead_s)
    assert t.communication_s == 0.0
    assert model.step_time(BatchShape.empty()).total_s == 0.0


def test_json_round_trip(tmp_path: Path) -> None:
    model = FittedCostModel.fit(records(TRUE, noise=0.02), GEOMETRY,
                                measured_on={"device": "cpu", "model": "tiny"})
    path = model.save(tmp_path / "m.fitted.json")
    loaded = FittedCostModel.load(path)
    assert loaded.to_json() == model.to_json()
    s = shape([(100, 20)], [5, 6, 7])
    assert loaded.step_time(s) == model.step_time(s)
    values = json.loads(path.read_text())
    assert [f["name"] for f in values["features"]] == list(FEATURE_NAMES)
    assert values["measured_on"]["device"] == "cpu"
    assert "in_process" in values["frontend_config"]


def test_scaled_model_multiplies_every_cost() -> None:
    costs = FrontendCosts.fit(stage_rows("loop", "post", 60e-6, 15e-6, 30e-6))
    costs = dataclasses.replace(costs, wakeup=IdleWakeup(extra_s=2e-3, ramp_s=5e-3, num_rows=6))
    model = FittedCostModel(GEOMETRY, TRUE, 16, frontend=costs)
    slow = model.scaled(1.5)
    s = shape([(100, 20)], [5, 6, 7])
    assert slow.step_time(s).total_s == pytest.approx(1.5 * model.step_time(s).total_s)
    assert slow.frontend.get("loop/post")(4, 1) == pytest.approx(1.5 * costs.get("loop/post")(4, 1))
    assert slow.frontend.wakeup == IdleWakeup(extra_s=pytest.approx(3e-3), ramp_s=5e-3,
                                              num_rows=6)
    assert slow.measured_on["scaled_by"] == 1.5
    with pytest.raises(ConfigError):
        model.scaled(0.0)


def test_load_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        FittedCostModel.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ConfigError, match="not a fitted cost model"):
        FittedCostModel.load(bad)
    with pytest.raises(ConfigError, match="lacks"):
        FittedCostModel(GEOMETRY, {"step": 1.0})
    with pytest.raises(ConfigError, match=">= 0"):
        FittedCostModel(GEOMETRY, {**TRUE, "step": -1.0})
    for coefficient in (math.inf, math.nan, None, "1"):
        with pytest.raises(ConfigError, match="must be finite numbers >= 0"):
            FittedCostModel(GEOMETRY, {**TRUE, "step": coefficient})  # type: ignore[dict-item]
    good = FittedCostModel(GEOMETRY, TRUE).save(tmp_path / "good.json")
    values = json.loads(good.read_text())
    broken = {
        "list": [],
        "no geometry": {k: v for k, v in values.items() if k != "geometry"},
        "short geometry": {**values, "geometry": {"num_layers": 2}},
        "infinite front end": {**values, "frontend": {"idle_wakeup": {"wakeup_s": math.inf}}},
    }
    for name, content in broken.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(content))
        with pytest.raises(ConfigError, match=r"fitted cost model|must be a finite number"):
            FittedCostModel.load(f)


def stage_rows(kind: str, name: str, a: float, b: float, c: float) -> list[ProfileRecord]:
    out = []
    for size in (1, 2, 4, 8, 16, 32):
        for size2 in (0, 1, 3):
            t = a + b * size + c * size2
            out.append(ProfileRecord(kind, name, None, size, size2, t, t, t, t, 4, math.nan))
    return out


def test_frontend_costs_recovered_and_mapped_onto_the_serial_loop() -> None:
    rows = (stage_rows("loop", "schedule", 80e-6, 3e-6, 20e-6)
            + stage_rows("loop", "post", 60e-6, 15e-6, 30e-6)
            + stage_rows("loop", "gap", 20e-6, 40e-6, 0.0)
            + stage_rows("frontend", "admit", 15e-6, 0.2e-6, 0.0))
    costs = FrontendCosts.fit(rows)
    post = costs.get("loop/post")
    assert (post.intercept_s, post.slope_s, post.slope2_s) == pytest.approx(
        (60e-6, 15e-6, 30e-6), rel=1e-6)
    assert costs.get("frontend/detokenize").num_rows == 0  # not measured: zero cost
    fe = costs.frontend_config_values("in_process", mean_output_len=10.0)
    assert fe["ipc_latency_s"] == 0.0 and fe["detokenize_s_per_token"] == 0.0
    assert fe["output_batch_overhead_s"] == pytest.approx(60e-6)
    assert fe["update_overhead_s"] == pytest.approx(60e-6 + 20e-6)
    assert fe["schedule_overhead_s"] == pytest.approx(80e-6)
    assert fe["schedule_s_per_request"] == pytest.approx(3e-6 + 15e-6 + (20e-6 + 30e-6) / 10)
    assert fe["request_overhead_s"] == pytest.approx(40e-6)  # in-loop admission (gap slope)
    no_gap = FrontendCosts({k: v for k, v in costs.stages.items() if k != "loop/gap"})
    assert no_gap.frontend_config_values()["request_overhead_s"] == pytest.approx(15e-6)
    from sim.config import FrontendConfig

    FrontendConfig(**fe)  # valid as the simulator's config
    FrontendConfig(**costs.frontend_config_values("stages"))
    with pytest.raises(ConfigError, match="mapping"):
        costs.frontend_config_values("nope")


def wakeup_rows(base: float, extra: float, ramp_s: float,
                idle_us: tuple[int, ...] = (2000, 5000, 10000, 30000, 100000)
                ) -> list[ProfileRecord]:
    out = [ProfileRecord("loop", "wakeup", None, 0, 0, base, base, base, base, 50, math.nan)]
    for d in idle_us:
        t = base + extra * min(1.0, d * 1e-6 / ramp_s)
        out.append(ProfileRecord("loop", "wakeup", None, d, 0, t, t, t, t, 10, math.nan))
    return out


@pytest.mark.parametrize(("ramp_s", "fitted_ramp_s"), [(1e-4, 0.0), (0.005, 0.005),
                                                       (0.01, 0.01), (0.03, 0.03)])
def test_idle_wakeup_recovered_and_mapped(ramp_s: float, fitted_ramp_s: float) -> None:
    # a ramp shorter than the shortest idle duration measured looks like none (0)
    costs = FrontendCosts.fit(wakeup_rows(5e-3, 3e-3, ramp_s) + stage_rows(
        "loop", "schedule", 80e-6, 3e-6, 20e-6))
    w = costs.wakeup
    assert (w.extra_s, w.ramp_s, w.num_rows) == pytest.approx((3e-3, fitted_ramp_s, 6))
    ramp_s = fitted_ramp_s or 1e-3
    from sim.config import FrontendConfig

    half = 1.5e-3 if fitted_ramp_s else 3e-3
    for mode in ("in_process", "stages"):
        fe = costs.frontend_config_values(mode)
        assert (fe["idle_wakeup_s"], fe["idle_wakeup_ramp_s"]) == pytest.approx(
            (3e-3, fitted_ramp_s))
        config = FrontendConfig(**fe)
        assert config.wakeup_s(ramp_s / 2) == pytest.approx(half)
        assert config.wakeup_s(1.0) == pytest.approx(3e-3) and config.wakeup_s(0.0) == 0.0
    back = FrontendCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert back == costs


def test_idle_wakeup_unmeasured_or_absent_costs_nothing() -> None:
    assert FrontendCosts.fit([]).wakeup == IdleWakeup()
    only_base = wakeup_rows(5e-3, 0.0, 0.01)[:1]
    assert IdleWakeup.fit(only_base) == IdleWakeup()
    faster = IdleWakeup.fit(wakeup_rows(5e-3, -1e-3, 0.01))  # sleeping helped: no cost
    assert faster.extra_s == 0.0
    # a fitted model saved before the wake-up probe existed still loads
    assert FrontendCosts.from_json({}).wakeup == IdleWakeup()


def test_profile_csv_from_the_profiler_reads_back(tmp_path: Path) -> None:
    from engine.worker.profiler import ProfileRow, SampleStats, stats_row, write_profile_csv

    s = shape([(64, 16)], [10, 20], partial=1)
    rows = [ProfileRow("mixed", "step", s, s.num_tokens, SampleStats.of([0.01, 0.03, 0.02])),
            stats_row("loop", "post", 5, [1e-4, 2e-4], size2=2)]
    path = write_profile_csv(tmp_path / "p.csv", rows)
    step, post = read_profile_csv(path)
    assert step.shape == s and step.kind == "mixed"
    assert step.median_s == 0.02 and step.mean_s == pytest.approx(0.02)
    assert (post.size, post.size2, post.shape) == (5, 2, None)
    assert post.mean_s == pytest.approx(1.5e-4) and math.isnan(post.cpu_ratio)
    (tmp_path / "broken.csv").write_text("kind,name\nprefill,step\n")
    with pytest.raises(ConfigError, match="not a profile row"):
        read_profile_csv(tmp_path / "broken.csv")


def test_the_simulator_runs_with_a_fitted_model(tmp_path: Path) -> None:
    from sim.config import SimConfig
    from sim.runtime import make_cost_model, run_simulation
    from workload.config import WorkloadConfig

    path = FittedCostModel(GEOMETRY, TRUE, 16).save(tmp_path / "m.fitted.json")
    cfg = SimConfig(cost_model=f"fitted:{path}", num_gpu_blocks=256, max_model_len=1024,
                    workload=WorkloadConfig(num_prompts=20, request_rate=50.0,
                                            random_input_len=64, random_output_len=8))
    assert isinstance(make_cost_model(cfg), FittedCostModel)
    result = run_simulation(cfg)
    assert result.stats.num_requests == 20 and result.stats.num_rejected == 0
    assert result.stats.num_bulk_steps > 0  # the decode fast path was used


def test_after_idle_report_adds_the_fitted_wakeup_cost() -> None:
    from types import SimpleNamespace

    import pandas as pd

    from engine.core.interfaces import StepTime
    from experiments.validation.report import _wakeup_notes, after_idle_steps

    # steps 0..3: step 2 starts 50 ms after step 1's outputs (idle), the others back to back;
    # the step model says 4 ms; the idle step measured 7 ms, the others 4 ms
    steps = pd.DataFrame({"step_id": [0, 1, 2, 3],
                          "schedule_time_s": [0.0, 0.004, 0.058, 0.065],
                          "update_time_s": [0.004, 0.008, 0.065, 0.069],
                          "delivered_time_s": [0.004, 0.008, 0.065, 0.069]})
    samples = [SimpleNamespace(step_id=i, shape=None, execute_time_s=t)
               for i, t in enumerate([0.004, 0.004, 0.007, 0.004])]
    model = SimpleNamespace(step_time=lambda shape: StepTime(0.004),
                            frontend=FrontendCosts(wakeup=IdleWakeup(0.003, 0.01, 6)))
    res = after_idle_steps(steps, samples, model)
    a, b = res["after_idle"], res["back_to_back"]
    assert (a["num_steps"], b["num_steps"]) == (1, 3)
    assert a["total_rel_err"] == pytest.approx(-3 / 7)
    assert a["with_wakeup_total_rel_err"] == pytest.approx(0.0)
    assert b["with_wakeup_total_rel_err"] == pytest.approx(0.0)
    assert "3.00 ms" in _wakeup_notes(res)[0] and "+0.0%" in _wakeup_notes(res)[0]
    unmeasured = after_idle_steps(steps, samples, SimpleNamespace(
        step_time=model.step_time, frontend=FrontendCosts()))
    assert "no wake-up probe" in _wakeup_notes(unmeasured)[0]
