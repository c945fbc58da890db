"""Simulated runs built to have one bottleneck each get that verdict; and on simulated logs
(preemptions, many token runs) ``summarize`` equals the per-token vllm transcription."""

from __future__ import annotations

import functools

import pytest

from experiments.run_meta import simulated_run_meta
from reports.diagnosis import VERDICTS, diagnose
from reports.metrics import summarize
from reports.tables import build_tables
from sim.config import FrontendConfig, SimConfig
from sim.runtime import run_simulation
from tests.reports.logs import reference_metrics, reference_outputs
from workload.config import WorkloadConfig

SCENARIOS: dict[str, SimConfig] = {
    # one API server, 20 ms per request, 80 req/s offered: the front end saturates
    "front-end-bound": SimConfig(
        frontend=FrontendConfig(num_api_servers=1, request_overhead_s=0.02),
        workload=WorkloadConfig(num_prompts=150, request_rate=80.0, random_input_len=256,
                                random_output_len=32),
    ),
    # 300 KV blocks (~4,800 tokens) for 640-token requests at 40 req/s
    "queue/KV-bound": SimConfig(
        num_gpu_blocks=300,
        workload=WorkloadConfig(num_prompts=150, request_rate=40.0, random_input_len=512,
                                random_output_len=128),
    ),
    # 8,000-token prompts at 20 req/s: more prefill than one H100 computes
    "compute-bound": SimConfig(
        workload=WorkloadConfig(num_prompts=120, request_rate=20.0, random_input_len=8000,
                                random_output_len=8),
    ),
    # 200 µs per detokenized token: the output processor saturates
    "output-bound": SimConfig(
        frontend=FrontendConfig(detokenize_s_per_token=2e-4),
        workload=WorkloadConfig(num_prompts=300, request_rate=40.0, random_input_len=256,
                                random_output_len=128),
    ),
    "healthy": SimConfig(
        workload=WorkloadConfig(num_prompts=200, request_rate=5.0, random_input_len=512,
                                random_output_len=64),
    ),
}


@functools.cache
def simulated(name: str):  # type: ignore[no-untyped-def]
    res = run_simulation(SCENARIOS[name])
    return res, build_tables(res.event_log), simulated_run_meta(res)


@pytest.mark.parametrize("verdict", list(SCENARIOS))
def test_each_scenario_gets_its_verdict(verdict):
    _, tables, meta = simulated(verdict)
    d = diagnose(tables, meta)
    assert d.verdict == verdict, d.text
    assert d.verdict in VERDICTS
    assert "p99 TTFT is" in d.text and "Try " in d.text
    assert d.to_dict()["evidence"]["p99_ttft_ms"] > 0


def test_paragraphs_name_the_evidence():
    kv = diagnose(*simulated("queue/KV-bound")[1:]).text
    assert "KV usage was ≥ 95%" in kv and "preemptions happened" in kv and "waited" in kv
    fe = diagnose(*simulated("front-end-bound")[1:]).text
    assert "API server was busy" in fe and "median engine step" in fe
    ok = diagnose(*simulated("healthy")[1:]).text
    assert ok.startswith("No bottleneck")


def test_a_run_of_only_rejections_names_why() -> None:
    cfg = SimConfig(
        max_model_len=50, num_gpu_blocks=100,
        workload=WorkloadConfig(num_prompts=6, random_input_len=100, random_output_len=10,
                                random_range_ratio=0.5),
    )
    res = run_simulation(cfg)
    text = diagnose(build_tables(res.event_log), simulated_run_meta(res)).text
    assert text.startswith("No request completed: 6 of 6 were rejected — 6 such as “prompt (")
    assert "exceeds max_model_len (50)”" in text


@pytest.mark.parametrize("name", ["queue/KV-bound", "healthy"])
def test_summary_equals_per_token_vllm_reference(name):
    res, tables, meta = simulated(name)
    percentiles = [50, 90, 99, 99.9]
    goodput = {"ttft": 500.0, "tpot": 8.0}
    s = summarize(tables, meta, goodput=goodput, percentiles=percentiles,
                  percentile_metrics=["ttft", "tpot", "itl", "e2el"])
    if name == "queue/KV-bound":
        assert s["engine"]["num_preemptions"] > 0  # ITLs across token runs are exercised
    ref = reference_metrics(reference_outputs(res.event_log), s["duration"], percentiles, goodput)
    for key, value in ref.items():
        if key.startswith(("p", "median")) and key.endswith("_ms"):
            assert s[key] == value, key  # numpy.percentile, bit for bit
        else:
            assert s[key] == pytest.approx(value, rel=1e-9), key
