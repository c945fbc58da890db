"""vllm bench serve's metrics, result JSON and table, from hand-made client outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.loadgen.client import RequestOutput
from experiments.loadgen.result import (
    ResultHeader,
    benchmark_result,
    calculate_metrics,
    format_result,
)
from tests.loadgen.reader import DETAIL_KEYS, VLLM_KEYS, read_result


def outputs() -> list[RequestOutput]:
    """a: 3 tokens (ttft 0.1, itls 0.05 0.05); b: 1 token; c: failed; d: 4 tokens in 3 chunks
    (usage says 4: vllm counts usage, ITLs are chunk gaps)."""
    return [
        RequestOutput("a", success=True, latency=0.2, output_tokens=3, ttft=0.1,
                      itl=[0.05, 0.05], prompt_len=10, start_time=100.0),
        RequestOutput("b", success=True, latency=0.3, output_tokens=1, ttft=0.3, itl=[],
                      prompt_len=20, start_time=100.5, client_queue_time=0.2),
        RequestOutput("c", success=False, error="Bad Request: too long", prompt_len=99,
                      start_time=101.0),
        RequestOutput("d", success=True, latency=1.6, output_tokens=4, ttft=0.4,
                      itl=[0.2, 1.0], prompt_len=30, start_time=101.2),
    ]


def header(**kw: object) -> ResultHeader:
    values: dict[str, object] = dict(
        date="20260101-000000", backend="openai", label=None, model_id="m", tokenizer_id="m",
        num_prompts=4, request_rate=2.0, burstiness=1.0, max_concurrency=None, metadata={})
    values.update(kw)
    return ResultHeader(**values)  # type: ignore[arg-type]


def test_metrics_follow_vllm_definitions() -> None:
    m = calculate_metrics(outputs(), 4.0, {"ttft": 350, "tpot": 60})
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input, m.total_output) == (60, 8)
    assert m.actual_output_lens == [3, 1, 0, 4]
    assert m.request_throughput == 3 / 4.0 and m.output_throughput == 8 / 4.0
    assert m.total_token_throughput == 68 / 4.0
    # TPOT: a (0.2-0.1)/2, d (1.6-0.4)/3; b has one token (0 for goodput only)
    assert m.tpots == pytest.approx([0.05, 0.4])
    assert m.itls == [0.05, 0.05, 0.2, 1.0]
    # goodput: a (ttft 100 ms, tpot 50) and b (300, 0) meet both; d fails tpot
    assert m.request_goodput == 2 / 4.0
    # one-second buckets from 100.0: a's tokens at 0.1, 0.15, 0.2 and b's at 0.8 in second 0,
    # d's at 1.6, 1.8 (second 1) and 2.8; a and b are in flight in second 0, d in 1 and 2
    assert m.max_output_tokens_per_s == 4.0
    assert m.max_concurrent_requests == 2


def test_result_keys_units_and_details(tmp_path: Path) -> None:
    out = outputs()
    short = benchmark_result(header(), out, 4.0, percentile_metrics=["ttft", "tpot", "itl",
                                                                       "e2el"],
                             percentiles=[50, 99, 99.9], goodput={})
    assert list(short)[:len(VLLM_KEYS)] == [k for k in short if k in VLLM_KEYS]
    assert set(VLLM_KEYS) <= set(short) and not set(DETAIL_KEYS) & set(short)
    assert short["request_goodput"] is None
    assert short["latencies"] == [0.2, 0.3, 0.0, 1.6]
    assert short["median_ttft_ms"] == pytest.approx(np.median([0.1, 0.3, 0.4]) * 1000)
    assert short["p99.9_itl_ms"] == pytest.approx(np.percentile([0.05, 0.05, 0.2, 1.0], 99.9)
                                                  * 1000)
    assert short["std_e2el_ms"] == pytest.approx(np.std([0.2, 0.3, 1.6]) * 1000)
    assert "p50_tpot_ms" in short and "client_queue_time" not in "".join(short)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(short))
    read_result(path)
    full = benchmark_result(header(max_concurrency=2), out, 4.0,
                            percentile_metrics=["ttft", "client_queue_time",
                                                "e2el_including_client_queue"],
                            percentiles=[99], goodput={"e2el": 500}, detailed=True)
    assert full["errors"] == ["", "", "Bad Request: too long", ""]
    assert full["output_lens"] == [3, 1, 0, 4] and full["itls"][3] == [0.2, 1.0]
    assert full["request_goodput"] == 2 / 4.0
    assert full["median_client_queue_time_ms"] == pytest.approx(0.0)
    assert full["mean_e2el_including_client_queue_ms"] == pytest.approx(
        np.mean([0.2, 0.5, 1.6]) * 1000)
    path.write_text(json.dumps(full))
    read_result(path)


def test_empty_lists_report_zero_as_vllm_does() -> None:
    failed = [RequestOutput("x", error="boom")]
    r = benchmark_result(header(num_prompts=1), failed, 1.0, percentile_metrics=["ttft"],
                         percentiles=[99], goodput={})
    assert (r["completed"], r["failed"], r["mean_ttft_ms"], r["p99_ttft_ms"]) == (0, 1, 0.0, 0.0)
    assert r["max_concurrent_requests"] == 0 and not math.isnan(r["mean_ttft_ms"])


def test_table_layout_is_vllms() -> None:
    r = benchmark_result(header(max_concurrency=8), outputs(), 4.0,
                         percentile_metrics=["ttft", "tpot", "itl", "e2el"],
                         percentiles=[99, 99.9], goodput={"ttft": 400})
    lines = format_result(r).splitlines()
    f = "{:<40} {:<10}".format
    g = "{:<40} {:<10.2f}".format
    assert lines[:5] == [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        f("Successful requests:", 3), f("Failed requests:", 1),
        f("Maximum request concurrency:", 8), g("Request rate configured (RPS):", 2.0)]
    assert lines[5:15] == [
        g("Benchmark duration (s):", 4.0), f("Total input tokens:", 60),
        f("Total generated tokens:", 8), g("Request throughput (req/s):", 0.75),
        g("Request goodput (req/s):", r["request_goodput"]),
        g("Output token throughput (tok/s):", 2.0),
        g("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"]),
        g("Peak concurrent requests:", r["max_concurrent_requests"]),
        g("Total token throughput (tok/s):", 17.0),
        "{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-")]
    assert g("P99.9 ITL (ms):", r["p99.9_itl_ms"]) in lines
    assert "{s:{c}^{n}}".format(s="Time per Output Token (excl. 1st token)", n=50,
                                c="-") in lines
    assert lines[-1] == "=" * 50
    no_rate = benchmark_result(header(request_rate=math.inf), outputs(), 4.0,
                               percentile_metrics=["ttft"], percentiles=[99], goodput={})
    text = format_result(no_rate)
    assert "Request rate configured" not in text and "Maximum request concurrency" not in text
    assert no_rate["request_rate"] == "inf"
