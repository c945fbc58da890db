"""The budget planner: layouts a GPU budget holds, the cost model's estimate and pre-screen,
confidence-driven seeds, the accelerated search, the Pareto fronts with their commands, and the
whole-deployment check — unit by unit, then end to end through ``twinserve plan``."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from engine.core.errors import UserError
from experiments.cli import main
from experiments.plan.capacity import (
    RateProbe,
    SearchSettings,
    find_capacity,
    seeds_needed,
    wilson_interval,
)
from experiments.plan.estimate import Estimate, WorkloadShape, dominated, estimate_config
from experiments.plan.front import _pareto, serve_commands
from experiments.plan.layouts import SpaceSpec, budget_layouts, pipeline_parallel_supported
from experiments.plan.planner import Candidate, PlanSpec, prescreen
from experiments.sweep.expfile import full_config
from sim.model_catalog import get_model
from tests.experiments.helpers import ConstantStepCostModel, analytic_base, analytic_capacity


def _layouts(model: str, gpu: str, n: int, **kw: object) -> set[tuple[int, int, bool, object]]:
    space = SpaceSpec(get_model(model), gpu, n, **kw)  # type: ignore[arg-type]
    return {(x.tensor_parallel_size, x.data_parallel_size, x.expert_parallel, x.quantization)
            for x in budget_layouts(space)}


def test_a_budget_holds_every_tp_and_dtype() -> None:
    got = _layouts("llama-3.1-70b", "h100-sxm", 8, quantizations=(None, "fp8"))
    assert got == {(tp, 1, False, q) for tp in (1, 2, 4, 8) for q in (None, "fp8")}
    # no fp8 tensor cores on A100: only the checkpoint's dtype
    assert {q for *_, q in _layouts("llama-3.1-8b", "a100-80gb", 4,
                                    quantizations=(None, "fp8"))} == {None}
    # an fp8 checkpoint is not quantized again
    assert {q for *_, q in _layouts("deepseek-v3", "h200-sxm", 8,
                                    quantizations=(None, "fp8"))} == {None}


def test_moe_budgets_are_data_parallel_groups_with_and_without_ep() -> None:
    got = _layouts("mixtral-8x7b", "h100-sxm", 8)
    groups = {(1, 8), (2, 4), (4, 2), (8, 1)}  # TP × DP = the budget: vLLM shards MoE over it
    assert {(tp, dp) for tp, dp, e, _ in got if e} == groups
    assert {(tp, dp) for tp, dp, e, _ in got if not e} == groups
    assert not any(e for *_, e, _ in _layouts("mixtral-8x7b", "h100-sxm", 8,
                                              expert_parallel="off"))
    with pytest.raises(UserError, match="--expert-parallel on needs a mixture-of-experts"):
        _layouts("llama-3.1-8b", "h100-sxm", 8, expert_parallel="on")


def test_pipeline_parallel_is_a_hook_until_the_simulator_has_it() -> None:
    if pipeline_parallel_supported():
        got = _layouts("llama-3.1-70b", "h100-sxm", 8, pp_sizes=(1, 2))
        assert any(x for x in got)
    else:
        with pytest.raises(UserError, match="pipeline parallelism in the simulator"):
            _layouts("llama-3.1-70b", "h100-sxm", 8, pp_sizes=(1, 2))


# -- estimate ---------------------------------------------------------------------------------
def test_the_estimate_of_a_closed_form_layout() -> None:
    """One request at a time of 10 steps of 10 ms: 10 req/s; the estimate finds the
    max_num_seqs bound."""
    cfg = full_config({**analytic_base(100, 10), "workload": {
        **analytic_base(100, 10)["workload"], "request_rate": 1.0}})
    shape = WorkloadShape(16.0, 10.0, 16.0)
    est = estimate_config(cfg, {"tpot": 50.0}, shape, lambda c: ConstantStepCostModel(0.01))
    assert est.capacity_rps == pytest.approx(analytic_capacity(0.01, 10, 10**6, 1.0, 0.99),
                                             rel=0.02)
    assert est.limit == "max_num_seqs" and est.light_tpot_s == pytest.approx(0.01)


def test_the_estimate_grows_with_gpus_and_fp8() -> None:
    shape = WorkloadShape(1000.0, 200.0, 4000.0, (50.0,) * 10 + (400.0,) * 10,
                          (800.0,) * 18 + (4000.0,) * 2)
    slos = {"ttft": 1000.0, "tpot": 50.0}

    def est(**kw: object) -> Estimate:
        d = {"model": "llama-3.1-70b", "gpu": "h200-sxm", "workload": {"num_prompts": 10},
             **kw}
        return estimate_config(full_config(d), slos, shape)

    tp2, tp4, tp4_fp8 = (est(tensor_parallel_size=2), est(tensor_parallel_size=4),
                         est(tensor_parallel_size=4, quantization="fp8"))
    assert 0 < tp2.capacity_rps < tp4.capacity_rps < tp4_fp8.capacity_rps
    assert tp2.light_tpot_s > tp4.light_tpot_s > tp4_fp8.light_tpot_s
    assert tp4.tokens_per_s_per_gpu == pytest.approx(tp4.capacity_rps * 200 / 4)


def test_dominance_needs_the_margin_on_both_axes() -> None:
    def e(per_gpu: float, per_user: float) -> Estimate:
        return Estimate(1.0, 0.01, 0.1, per_gpu, per_user, "tpot")

    assert dominated([e(100, 10), e(200, 20), e(120, 30)]) == [1, None, None]
    assert dominated([e(100, 10), e(110, 30)]) == [None, None]  # only 10% more per GPU


def test_prescreen_prunes_what_cannot_run_or_win() -> None:
    base = {"model": "llama-3.1-70b", "workload": {"dataset_name": "random",
                                                    "num_prompts": 10}}
    spec = PlanSpec(base=base, gpus=("h100-sxm",), num_gpus=8, quantizations=(None, "fp8"),
                    slos_ms={"ttft": 1000.0, "tpot": 50.0})
    shape = WorkloadShape(1000.0, 200.0, 4000.0)
    candidates = spec.candidates()
    estimates, pruned = prescreen(spec, candidates, shape)
    assert set(estimates) | set(pruned) == set(candidates)
    tp1 = next(c for c in candidates if c.tensor_parallel_size == 1 and not c.quantization)
    assert "cannot run" in pruned[tp1] and "does not fit" in pruned[tp1]
    assert any(r.startswith("dominated (estimate)") for r in pruned.values())
    assert len(pruned) < len(candidates)  # the front survives
    tight = PlanSpec(base=base, gpus=("h100-sxm",), num_gpus=8, slos_ms={"tpot": 2.0})
    _, pruned = prescreen(tight, tight.candidates(), shape)
    assert all("SLO out of reach" in r or "cannot run" in r for r in pruned.values())
    explicit = PlanSpec(base=base, gpus=("h100-sxm",), tp_sizes=(4, 8))
    assert prescreen(explicit, explicit.candidates(), shape)[1] == {}  # no pruning unasked


# -- seeds and search -----------------------------------------------------------------------------
def test_seeds_run_only_while_the_bound_is_open() -> None:
    lo, hi = wilson_interval(300, 300)
    assert 0.99 < lo < 1.0 == hi
    assert not seeds_needed([1.0], [300], 0.99)  # 300/300: the one-sided bound is above 99%
    assert seeds_needed([0.9933], [300], 0.99)  # 2 misses in 300: not yet sure
    assert not seeds_needed([0.9933, 0.98], [300, 300], 0.99)  # a failed seed settles it
    assert not seeds_needed([1.0], [300], 0.99) and seeds_needed([1.0], [100], 0.99)


def test_accelerated_search_from_a_wrong_estimate_stays_short() -> None:
    def count(accelerate: bool) -> int:
        calls: list[float] = []

        def probe(rate: float) -> RateProbe:
            calls.append(rate)
            return RateProbe(rate, (1.0 if rate <= 3.0 else 0.5,), 0.99)

        res = find_capacity(probe, SearchSettings(rate_start=24.0, tolerance=0.1, growth=1.25,
                                                  accelerate=accelerate))
        assert res.max_rate <= 3.0 < res.fail_rate and res.converged
        return len(calls)

    assert count(True) == 9 < count(False) == 13  # an 8× wrong start


# -- fronts and commands --------------------------------------------------------------------------
def test_pareto_flags() -> None:
    ok = [True, True, True, False, True]
    y = [100.0, 80.0, 90.0, 500.0, 100.0]
    x = [10.0, 30.0, 20.0, 50.0, 5.0]
    assert _pareto(ok, y, x) == [True, True, True, False, False]


def test_serve_commands_deploy_the_layout() -> None:
    spec = PlanSpec(base={"model": "mixtral-8x7b", "kv_cache_dtype": "fp8",
                          "engine": {"max_num_seqs": 256}}, gpus=("h100-sxm",), num_gpus=8)
    ep = Candidate("h100-sxm", 2, 4, expert_parallel=True)
    assert spec.replicas_in_budget(ep) == 1
    vllm, twin = serve_commands(spec, ep, 1)
    assert vllm == ("vllm serve mixtral-8x7b --tensor-parallel-size 2 --kv-cache-dtype fp8 "
                    "--max-num-seqs 256 --data-parallel-size 4 --enable-expert-parallel")
    assert "data-parallel MoE group is not served by twinserve serve" in twin
    dense_spec = PlanSpec(base={"model": "llama-3.1-8b", "kv_cache_dtype": "fp8",
                                "engine": {"max_num_seqs": 256}}, gpus=("h100-sxm",),
                          num_gpus=8)
    dense = Candidate("h100-sxm", 4, 1, quantization="fp8")
    vllm, twin = serve_commands(dense_spec, dense, 2)
    assert vllm.endswith("--quantization fp8 --kv-cache-dtype fp8 --max-num-seqs 256 "
                         "--data-parallel-size 2")
    assert twin.startswith("2 × [twinserve serve --emulate --model llama-3.1-8b --gpu "
                           "h100-sxm --tensor-parallel-size 4 --quantization fp8")


# -- end to end -----------------------------------------------------------------------------
TINY = ["--dataset-name", "random", "--num-prompts", "40", "--random-input-len", "256",
        "--random-output-len", "16", "--seeds", "2", "--max-probes", "6", "-j", "1"]


def test_plan_a_budget_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    rc = main(["plan", "--model", "llama-3.1-8b", "--gpus", "h100-sxm", "--num-gpus", "2",
               "--quantizations", "none", "fp8", "--slo", "ttft:300", "tpot:40",
               "--out", str(out), *TINY])
    assert rc == 0
    plan = pd.read_csv(out / "plan.csv")
    assert set(plan["tensor_parallel_size"]) == {1, 2} and len(plan) == 4
    assert plan["est_capacity_rps"].notna().all()
    front = pd.read_csv(out / "front.csv")
    assert front["on_user_front"].any() and front["on_ttft_front"].any()
    assert front["vllm_serve"].str.startswith("vllm serve llama-3.1-8b").all()
    assert (front.loc[front["on_user_front"], "meets_slo"]).all()
    assert (out / "front.png").stat().st_size > 10_000
    text = (out / "plan.md").read_text()
    assert "## Pareto front" in text and "## Recommended deployment" in text
    printed = capsys.readouterr().out
    assert "Recommended:" in printed and "simulated as a whole" in printed
    assert "vllm serve:      vllm serve llama-3.1-8b" in printed


@pytest.mark.parametrize(("args", "message"), [
    (["--num-gpus", "2", "--tp", "2"], "--num-gpus enumerates the layouts itself"),
    (["--num-gpus", "2", "--target-rate", "3"], "give one"),
    (["--num-gpus", "2", "--quantizations", "int4"], "invalid --quantizations value 'int4'"),
    (["--num-gpus", "2", "--expert-parallel", "on"], "needs a mixture-of-experts model"),
    (["--front-fractions", "1.5"], "--front-fractions must be in (0, 1)"),
])
def test_bad_budget_input_is_one_line(args: list[str], message: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "h100-sxm",
                 "--out", str(tmp_path), *TINY, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinserve: error: ") and message in err and err.count("\n") == 1


def test_budget_mode_math_is_consistent() -> None:
    spec = PlanSpec(base={"model": "llama-3.1-8b"}, gpus=("h100-sxm",), num_gpus=8)
    assert spec.replicas_in_budget(Candidate("h100-sxm", 2, 1)) == 4
    assert math.isclose(Candidate("h100-sxm", 2, 4).num_gpus, 8)


def test_the_printed_twinserve_command_parses_into_the_planned_config() -> None:
    from experiments.cli import build_parser
    from experiments.cli.cmd_serve import _sim_config

    spec = PlanSpec(base={"model": "qwen3-30b-a3b", "kv_cache_dtype": "fp8"},
                    gpus=("h200-sxm",), num_gpus=2)
    _, twin = serve_commands(spec, Candidate("h200-sxm", 2, 1, quantization="fp8"), 1)
    args = build_parser().parse_args(twin.split()[1:])
    cfg = _sim_config(args)
    assert (cfg.gpu, cfg.tensor_parallel_size, cfg.quantization, cfg.kv_cache_dtype) == (
        "h200-sxm", 2, "fp8", "fp8")


def test_a_probe_shorter_than_its_steady_state_is_flagged() -> None:
    """300 prompts at 36.9 req/s arrive in 8 s while each request lasts 22 s: the engine was
    still filling when arrivals stopped (Mixtral DP 8, 4000/1000 tokens)."""
    from experiments.plan.report import short_run_note

    short = [{"mean_e2el_ms": 22_000.0, "completed": 300}] * 2
    note = short_run_note(short, 36.9)
    assert note.startswith("short run: 300 prompts arrive in 8.13 s at 36.9 req/s")
    assert note.endswith("rerun with --num-prompts 2500 or more")  # 3 × 36.9 × 22 = 2435
    long = [{"mean_e2el_ms": 44_000.0, "completed": 300}]
    assert short_run_note(long, 1.95) == ""  # 154 s of arrivals > 3 × 44 s
    assert short_run_note([], 1.0) == ""
