"""``summarize`` against hand-computed answers and a per-token transcription of vllm bench."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from reports.errors import ReportError
from reports.itl import per_request_itls, pooled_itls
from reports.metrics import format_summary, summarize
from reports.tables import build_tables
from tests.reports.logs import known_log, reference_metrics, reference_outputs

ALL = ["ttft", "tpot", "itl", "e2el"]
VLLM_SERVE = Path("/work/oracle-venv/lib/python3.11/site-packages/vllm/benchmarks/serve.py")
#: the keys ``vllm bench serve --save-result`` (0.33.0) writes without --save-detailed,
#: besides the per-request arrays ``latencies``/``queue_times`` (METRICS.md: details only)
VLLM_KEYS = (
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests", "rtfx",
)
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")


@pytest.fixture(scope="module")
def tables():
    return build_tables(known_log())


def test_known_answers(tables):
    s = summarize(tables, {}, percentiles=[50, 99], percentile_metrics=ALL)
    assert s["duration"] == pytest.approx(6.6)  # first send 0.0 -> last delivery 6.6
    assert (s["completed"], s["failed"]) == (3, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (60, 8)
    assert s["request_throughput"] == pytest.approx(3 / 6.6)
    assert s["output_throughput"] == pytest.approx(8 / 6.6)
    assert s["total_token_throughput"] == pytest.approx(68 / 6.6)
    assert s["request_goodput"] is None
    assert s["mean_ttft_ms"] == pytest.approx(np.mean([2600, 2600, 1100]))
    assert s["median_ttft_ms"] == pytest.approx(2600)
    # TPOT skips the 1-token request b: a = 1000 ms, c = 5000/3 ms
    assert s["mean_tpot_ms"] == pytest.approx((1000 + 5000 / 3) / 2)
    assert s["p50_tpot_ms"] == pytest.approx((1000 + 5000 / 3) / 2)
    # pooled ITLs: a [1, 1], c [1, 3, 1] (s)
    assert s["mean_itl_ms"] == pytest.approx(1400)
    assert s["median_itl_ms"] == pytest.approx(1000)
    assert s["std_itl_ms"] == pytest.approx(800)
    assert s["p99_itl_ms"] == pytest.approx(np.percentile([1, 1, 1, 3, 1], 99) * 1000)
    assert s["mean_e2el_ms"] == pytest.approx(np.mean([4600, 2600, 6100]))


def test_pooled_itls_and_details(tables):
    ok = tables.requests["success"].to_numpy()
    itl = pooled_itls(tables, ok)
    expanded = np.sort(np.repeat(itl.values, itl.weights))
    np.testing.assert_allclose(expanded, [1, 1, 1, 1, 3])
    lists = per_request_itls(tables, ok)
    np.testing.assert_allclose(lists[0], [1, 1])  # a
    np.testing.assert_allclose(lists[1], [1, 3, 1])  # c
    assert lists[2] == []  # b: one token
    s = summarize(tables, {}, detailed=True)
    assert all(k in s for k in DETAIL_KEYS)
    assert s["output_lens"] == [3, 4, 1, 0] and s["errors"][3] == "prompt too long"
    assert s["ttfts"][3] == 0.0 and len(s["itls"][1]) == 3


GOODPUT_CASES = [
    dict(combo)
    for r in (1, 2, 3)
    for combo in itertools.combinations((("ttft", 2000.0), ("tpot", 1500.0), ("e2el", 5000.0)), r)
]


@pytest.mark.parametrize("goodput", GOODPUT_CASES, ids=lambda g: "+".join(g))
def test_goodput_every_slo_combination(tables, goodput):
    """ttft <= 2 s: only c; tpot <= 1.5 s: a and b (TPOT 0, one token); e2el <= 5 s: a, b."""
    sets = {"ttft": {"c"}, "tpot": {"a", "b"}, "e2el": {"a", "b"}}
    good = set.intersection(*(sets[k] for k in goodput))
    s = summarize(tables, {}, goodput=goodput)
    assert s["request_goodput"] == pytest.approx(len(good) / 6.6)
    assert s["slo_attainment"]["all"] == pytest.approx(len(good) / 3)
    for k in goodput:
        assert s["slo_attainment"][k] == pytest.approx(len(sets[k]) / 3)
    ref = reference_metrics(reference_outputs(known_log()), 6.6, [99], goodput)
    assert s["request_goodput"] == pytest.approx(ref["request_goodput"])


def test_goodput_boundary_is_inclusive(tables):
    s = summarize(tables, {}, goodput={"ttft": 1100.0 + 1e-9})
    assert s["request_goodput"] == pytest.approx(1 / 6.6)


def test_bad_options_raise_report_errors(tables):
    with pytest.raises(ReportError):
        summarize(tables, {}, goodput={"ttfb": 1.0})
    with pytest.raises(ReportError):
        summarize(tables, {}, goodput={"ttft": -1.0})
    with pytest.raises(ReportError):
        summarize(tables, {}, percentiles=[101])
    with pytest.raises(ReportError):
        summarize(tables, {}, percentile_metrics=["latency"])


def test_every_vllm_key_with_the_same_units(tables):
    percentiles = [50, 90, 99, 99.9]
    s = summarize(tables, {"config": {"model": "m"}}, goodput={"e2el": 5000},
                  percentiles=percentiles, percentile_metrics=ALL)
    expected = list(VLLM_KEYS)
    for m in ALL:
        expected += [f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms"]
        expected += [f"p{w}_{m}_ms" for w in ("50", "90", "99", "99.9")]
    missing = [k for k in expected if k not in s]
    assert not missing
    assert list(s)[: len(VLLM_KEYS) - 3] == list(VLLM_KEYS[:-3])  # vllm's leading order
    ref = reference_metrics(reference_outputs(known_log()), s["duration"], percentiles,
                            {"e2el": 5000})
    for key, value in ref.items():  # ms for latencies, req/s, tok/s: as vllm
        assert s[key] == pytest.approx(value, rel=1e-12), key
    json.dumps(s)  # plain JSON types only
    assert s["request_rate"] == "inf" and s["model_id"] == "m" and s["rtfx"] == 0.0


def test_default_selection_mirrors_vllm(tables):
    s = summarize(tables, {})
    assert "p99_ttft_ms" in s and "p99_itl_ms" in s and "p99_tpot_ms" in s
    assert "mean_e2el_ms" not in s and "p50_ttft_ms" not in s
    assert not any(k in s for k in DETAIL_KEYS)


@pytest.mark.skipif(not VLLM_SERVE.exists(), reason="vllm's source is not on this machine")
def test_key_list_matches_vllm_source():
    """The scalar keys vllm's benchmark() writes are exactly VLLM_KEYS."""
    src = VLLM_SERVE.read_text()
    keys = set(re.findall(r'result_json\["(\w+)"\] =', src))
    block = src[src.index("result = {\n            \"duration\""):]
    block = block[: block.index("}")]
    keys |= set(re.findall(r'"(\w+)":', block))
    arrays = {"input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
              "queue_times", "generated_texts", "errors"}
    optional = {"ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"}
    assert keys - arrays - optional == set(VLLM_KEYS)


def test_format_summary_layout(tables):
    s = summarize(tables, {"workload": {"request_rate": 2.0, "max_concurrency": 8}},
                  goodput={"ttft": 2000}, percentiles=[99, 99.9], percentile_metrics=ALL)
    lines = format_summary(s).splitlines()
    assert lines[0] == "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")
    assert lines[1] == "{:<40} {:<10}".format("Successful requests:", 3)
    assert "{:<40} {:<10}".format("Maximum request concurrency:", 8) in lines
    assert "{:<40} {:<10.2f}".format("Request rate configured (RPS):", 2.0) in lines
    assert "{:<40} {:<10.2f}".format("Request goodput (req/s):", 1 / 6.6) in lines
    assert "{:<40} {:<10.2f}".format("Peak concurrent requests:", 3) in lines  # a, b, c
    i = lines.index("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
    assert lines[i + 1].startswith("Mean TTFT (ms):") and lines[i + 3].startswith("P99 TTFT")
    assert lines[i + 4].startswith("P99.9 TTFT (ms):")
    assert "{s:{c}^{n}}".format(s="Inter-token Latency", n=50, c="-") in lines
    assert lines[-1] == "=" * 50


def test_empty_run_has_no_latencies_and_is_not_healthy():
    """vllm writes 0 for the latency of a run in which nothing completed; a 0 ms TTFT reads
    as perfect, so the summary says null and the diagnosis says nothing completed."""
    from engine.core.events import EventLog

    s = summarize(build_tables(EventLog()), {}, percentile_metrics=ALL)
    assert s["completed"] == 0 and s["mean_ttft_ms"] is None and s["p99_e2el_ms"] is None
    assert s["diagnosis"]["verdict"] == "nothing-completed"
    assert "Mean TTFT (ms):                          n/a" in format_summary(s)
    json.dumps(s, allow_nan=True)


def test_peaks_of_a_run_spanning_more_seconds_than_an_array_could_hold() -> None:
    from sim.config import SimConfig
    from sim.runtime import run_simulation
    from workload.config import WorkloadConfig

    # the longest span a workload may have (workload.config.MAX_SPAN_S = 2^31 s)
    cfg = SimConfig(workload=WorkloadConfig(num_prompts=3, request_rate=1.5e-9,
                                            random_input_len=64, random_output_len=5))
    tables = build_tables(run_simulation(cfg).event_log)
    span_s = tables.requests["last_token_delivered_s"].max() - tables.requests["arrival_s"].min()
    assert span_s > 1e9  # ≈ 2 × 10^9 one-second buckets (16 GB of counts) if they were dense
    s = summarize(tables, {})
    assert s["max_concurrent_requests"] == 1
    assert s["max_output_tokens_per_s"] == 5.0  # one request's tokens all land in one second
