"""Smoke runs of the cost-model benchmarks (bench/): the GPU step-time script on the CPU with
a tiny model, and the end-to-end validation on a few rows and a hand-made step file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cost_validation

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_step_times_smoke_prints_measured_beside_predicted(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_step_times", "--smoke", "--json-out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-7].startswith("| step | measured ms (ours) | predicted vLLM eager ms")
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 5
    assert all(r["measured_ms"] > 0 and r["predicted_eager_ms"] > 0 for r in data["rows"])


def test_validation_rows_are_simulated_or_say_why(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    steps = tmp_path / "steps.csv"
    steps.write_text("model,gpu,tp,quantization,kv_cache_dtype,step,measured_ms,source\n"
                     "llama-3.1-8b,h100-sxm,1,,,decode:1x1024,6.5,hand-made\n"
                     "llama-3.1-70b,h200-sxm,4,fp8,fp8,decode:4x5120,10.0,hand-made\n")
    out = tmp_path / "pred.csv"
    assert cost_validation.main(["--limit", "12", "--steps", str(steps), "--out",
                                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "## Rows not simulated" in text and "needs ShareGPT" in text
    assert "| vllm_ci_h200 | batch_latency | 2 |" in text
    assert text.rstrip().splitlines()[-1].startswith("| ")
    assert "## Measured steps" in text and "decode:4x5120" in text
    rows = out.read_text().splitlines()
    assert rows[0] == "row_id,source,metric,published,auto,roofline" and len(rows) == 13


def test_the_aiperf_procedure_warms_up_then_measures_a_burst_from_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``2·c`` warm-up requests drain before ``20·c`` measured ones start together; prompts
    come from a pool of 100, so a measured prompt is often one the prefix cache holds."""
    from sim.config import SimConfig
    from sim.runtime import SimRuntime
    from workload.config import WorkloadConfig

    runs: list[object] = []

    class Recording(SimRuntime):
        def run(self):  # type: ignore[no-untyped-def]
            result = super().run()
            runs.append(result)
            return result

    monkeypatch.setattr("sim.runtime.SimRuntime", Recording)
    cfg = SimConfig(model="llama-3.1-8b", gpu="h100-sxm", workload=WorkloadConfig(
        dataset_name="random", num_prompts=12, request_rate=float("inf"), max_concurrency=4,
        random_input_len=256, random_output_len=8, seed=0))
    metrics = cost_validation.aiperf_metrics(cfg)
    warm, full = runs
    assert len(warm.workload) == 8 and len(full.workload) == 88  # 2·c, then 2·c + 20·c
    from reports.tables import build_tables

    req = build_tables(full.event_log).requests.sort_values("req_index")
    arrivals = req["arrival_s"].to_numpy()
    drained = req["last_token_delivered_s"].to_numpy()[:8].max()
    assert (arrivals[:4] == 0).all() and (arrivals[8:] > drained).all()  # c at once, twice
    assert (arrivals[8:12] == arrivals[8]).all()  # the first c measured requests: at once
    assert len(set(full.workload.shared_prefix_ids.tolist())) <= 100
    assert (req["prefix_hit_tokens"].to_numpy()[8:] > 0).any()
    measured = req.iloc[8:]
    assert metrics["ttft"] == pytest.approx(measured["ttft_s"].mean() * 1e3)
    assert metrics["tpot"] == pytest.approx(measured["tpot_s"].mean() * 1e3)


def test_validation_set_states_its_sources() -> None:
    rows = cost_validation.read_rows()
    assert len(rows) == 507
    assert {r.source for r in rows} >= {"aic_silicon", "vllm_ci_h100", "inferencebench_h100",
                                        "splitwise_perf_model"}
    assert all(r.value > 0 and r.unit for r in rows)
    text = (ROOT / "bench" / "data" / "VALIDATION.md").read_text()
    for source in {r.source for r in rows}:
        assert source in text


def test_rows_run_with_the_scheduling_their_vllm_defaulted_to() -> None:
    # vLLM made async scheduling the default in 0.14.0; earlier releases and V0 ran sync.
    published_async = cost_validation.published_async
    assert not published_async("0.12.0") and not published_async("0.10.0")
    assert published_async("0.14.0") and published_async("0.23.0")
    assert not published_async("not stated (measured 2025-10-29 per silicon_data_source)")
    assert published_async("not stated (measured 2026-02-01)")
    assert published_async("not stated (vLLM main at that CI build)")  # undated: 0.33's
    rows = {r.row_id: r for r in cost_validation.read_rows()}
    ci_h200 = rows[1]  # the V0 build of 2024-10-28
    assert ci_h200.source == "vllm_ci_h200" and ci_h200.metric == "batch_latency"
    cfg = cost_validation.sim_config(ci_h200, "auto")
    assert not cfg.engine.async_scheduling
    assert not cfg.engine.enable_prefix_caching  # vllm bench latency turns it off
    assert cost_validation.sim_config(ci_h200, "auto", "async").engine.async_scheduling
    assert cost_validation.sim_config(rows[5], "auto").engine.async_scheduling  # undated


def test_synchronous_rows_pay_each_steps_host_work() -> None:
    from sim.cost.explain import parse_step
    from sim.runtime import make_cost_model, run_simulation

    row = next(r for r in cost_validation.read_rows() if r.row_id == 1)
    sync_cfg = cost_validation.sim_config(row, "auto")
    latency = {mode: cost_validation.metrics_of(run_simulation(
        cost_validation.sim_config(row, "auto", mode)))["batch_latency"]
        for mode in ("published", "async")}
    per_step_s = (latency["published"] - latency["async"]) / 1e3 / (row.osl or 128)
    step = make_cost_model(sync_cfg).step_time(parse_step("decode:8x96"))
    f = sync_cfg.frontend
    host_s = f.schedule_overhead_s + 8 * f.schedule_s_per_request + f.update_overhead_s
    # Synchronously, input preparation at least is serial with the device; at most the whole
    # host side of a step is (scheduling, preparation, launching, the output update).
    assert step.host_s < per_step_s < host_s + step.host_s + step.launch_s


def test_splitwise_rows_run_as_the_sources_static_batches() -> None:
    """B requests of P tokens sent together, T outputs each, no prefix caching, synchronous
    (measured before vLLM scheduled asynchronously); a batch's TTFT and requests beyond
    Llama-2-70B's context are not simulated, and say why."""
    rows = [r for r in cost_validation.read_rows() if r.source == "splitwise_perf_model"]
    assert len(rows) == 228 and {r.gpu for r in rows} == {"a100-80gb", "h100-sxm"}
    assert {r.tp for r in rows} == {2, 4, 8} and {r.metric for r in rows} == {"ttft", "tpot"}
    batch = next(r for r in rows if r.metric == "tpot" and r.concurrency == 16)
    cfg = cost_validation.sim_config(batch, "auto")
    w = cfg.workload
    assert (w.num_prompts, w.random_input_len, w.random_output_len) == (16, 512, 128)
    assert w.request_rate == float("inf") and w.max_concurrency is None
    assert not cfg.engine.enable_prefix_caching and not cfg.engine.async_scheduling
    assert cfg.dtype == "float16" and cfg.tensor_parallel_size == batch.tp
    assert cost_validation.why_not(batch) == ""
    batch_ttft = next(r for r in rows if r.metric == "ttft" and (r.concurrency or 1) > 1)
    assert "whose first token" in cost_validation.why_not(batch_ttft)
    long = next(r for r in rows if (r.isl or 0) + (r.osl or 0) > 4096)
    assert "4096-token context" in cost_validation.why_not(long)
    simulated = [r for r in rows if not cost_validation.why_not(r)]
    assert len(simulated) == 144
