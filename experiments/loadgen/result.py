"""vllm bench serve's result: its metrics, its JSON and its printed table, from client outputs.

Follows vllm 0.33.0 (``vllm/benchmarks/serve.py``: ``calculate_metrics``, ``benchmark``,
``main_async``) key for key:

* a successful request counts its ``output_tokens`` (from the usage chunk; a request without
  one counts the tokens of its text with the tokenizer, else 1); TPOT = (latency − TTFT) /
  (n − 1) for n > 1 (0 for goodput), ITLs pooled, all statistics ``numpy`` mean / median /
  population std / ``percentile`` of the lists (``or 0`` when empty), in ms;
* ``max_output_tokens_per_s`` / ``max_concurrent_requests``: one-second buckets from the
  earliest start of a successful request;
* the JSON: ``date, endpoint_type, backend, label, model_id, tokenizer_id, num_prompts``, the
  ``--metadata`` pairs, ``request_rate`` ("inf" when infinite), ``burstiness``,
  ``max_concurrency``, the ramp-up keys when ramping, then the benchmark's keys (``duration`` …
  ``rtfx``), ``rps_change_events`` when ramping, and ``mean_/median_/std_/p{P}_{metric}_ms`` for
  each selected metric; without ``--save-detailed`` the per-request arrays are dropped except
  ``latencies`` and ``queue_times`` (as vllm does);
* the table: "Serving Benchmark Result", line for line (``format_result``).

``client_queue_time`` and ``e2el_including_client_queue`` (vllm's percentile metrics for a run
with ``--max-concurrency``) are reported when selected, as vllm reports them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.loadgen.client import RequestOutput
from reports.stats import METRIC_TITLES, MS_PER_S, format_summary

#: vllm bench serve's percentile metrics: key -> (printed name, section header); the client's
#: queueing metrics come on top of the four every report has.
METRICS: dict[str, tuple[str, str]] = {
    **METRIC_TITLES,
    "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
    "e2el_including_client_queue": ("E2EL incl. Client Queue",
                                    "Queue-inclusive End-to-end Latency"),
}
#: arrays ``--save-detailed`` keeps (vllm drops them otherwise; latencies/queue_times stay)
DETAIL_ARRAYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts",
                 "errors")


@dataclass(frozen=True, slots=True)
class BenchmarkMetrics:
    """vllm's ``BenchmarkMetrics`` (latency lists kept in seconds for the statistics)."""

    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    ttfts: list[float]
    tpots: list[float]
    itls: list[float]
    e2els: list[float]
    actual_output_lens: list[int]


def _output_len(out: RequestOutput, tokenizer: object | None) -> int:
    if out.output_tokens:
        return out.output_tokens
    if tokenizer is None:
        return 1
    return len(tokenizer.encode(out.generated_text, add_special_tokens=False))  # type: ignore[attr-defined]


def calculate_metrics(outputs: Sequence[RequestOutput], dur_s: float,
                      goodput: Mapping[str, float], tokenizer: object | None = None
                      ) -> BenchmarkMetrics:
    """vllm 0.33.0's ``calculate_metrics`` over the client's outputs."""
    lens: list[int] = []
    total_input = completed = good = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    for out in outputs:
        if not out.success:
            lens.append(0)
            continue
        n = _output_len(out, tokenizer)
        lens.append(n)
        total_input += out.prompt_len
        tpot = 0.0
        if n > 1:
            tpot = (out.latency - out.ttft) / (n - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += out.itl
        ttfts.append(out.ttft)
        e2els.append(out.latency)
        completed += 1
    if goodput:
        checks = [(values, goodput[name] / MS_PER_S)
                  for name, values in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els))
                  if name in goodput]
        good = sum(all(slo >= values[i] for values, slo in checks) for i in range(completed))
    peak_tokens, peak_conc = _per_second_peaks([o for o in outputs if o.success])
    total_output = sum(lens)
    return BenchmarkMetrics(
        completed, len(outputs) - completed, total_input, total_output, completed / dur_s,
        good / dur_s, total_output / dur_s, (total_input + total_output) / dur_s,
        peak_tokens, peak_conc, ttfts, tpots, itls, e2els, lens,
    )


def _per_second_peaks(ok: Sequence[RequestOutput]) -> tuple[float, int]:
    """vllm's one-second buckets: tokens at start + ttft + cumulated itls; a request counted
    in every second from its start second to its end second."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    t_end = max(o.start_time + o.latency for o in ok)
    seconds = int(np.ceil(t_end - t0)) + 1
    tokens = np.zeros(seconds)
    concurrent = np.zeros(seconds)
    for o in ok:
        times = np.cumsum([o.start_time + o.ttft, *o.itl])
        buckets = (times - t0).astype(np.int64)
        buckets = buckets[(buckets >= 0) & (buckets < seconds)]
        np.add.at(tokens, buckets, 1)
        first, last = int(o.start_time - t0), int(o.start_time + o.latency - t0)
        concurrent[first:last + 1] += 1
    return float(tokens.max()), int(concurrent.max())


def _stats(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, Any]:
    data = list(values) or [0.0]
    return {
        "mean": float(np.mean(data)) * MS_PER_S,
        "median": float(np.median(data)) * MS_PER_S,
        "std": float(np.std(data)) * MS_PER_S,
        "percentiles": [(p, float(np.percentile(data, p)) * MS_PER_S) for p in percentiles],
    }


def percentile_word(p: float) -> str:
    """vllm's spelling of a percentile in keys and labels: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


@dataclass(frozen=True, slots=True)
class ResultHeader:
    """The keys ``main_async`` puts before the benchmark's own (the run's setup)."""

    date: str
    backend: str
    label: str | None
    model_id: str
    tokenizer_id: str | None
    num_prompts: int
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    metadata: Mapping[str, str]
    ramp_up: tuple[str, float, float] | None = None  # (strategy, start, end)


def benchmark_result(
    header: ResultHeader,
    outputs: Sequence[RequestOutput],
    duration_s: float,
    *,
    percentile_metrics: Sequence[str],
    percentiles: Sequence[float],
    goodput: Mapping[str, float],
    tokenizer: object | None = None,
    detailed: bool = False,
    rps_change_events: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """vllm bench serve's result JSON (see the module docstring for the key order)."""
    m = calculate_metrics(outputs, duration_s, goodput, tokenizer)
    out: dict[str, Any] = {
        "date": header.date, "endpoint_type": header.backend, "backend": header.backend,
        "label": header.label, "model_id": header.model_id, "tokenizer_id": header.tokenizer_id,
        "num_prompts": header.num_prompts, **dict(header.metadata),
        "request_rate": header.request_rate if header.request_rate < math.inf else "inf",
        "burstiness": header.burstiness, "max_concurrency": header.max_concurrency,
    }
    if header.ramp_up is not None:
        out["ramp_up_strategy"], out["ramp_up_start_rps"], out["ramp_up_end_rps"] = header.ramp_up
    out.update({
        "duration": duration_s, "completed": m.completed, "failed": m.failed,
        "total_input_tokens": m.total_input, "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput if goodput else None,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": m.actual_output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [list(o.itl) for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "queue_times": [o.client_queue_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
        "max_output_tokens_per_s": m.max_output_tokens_per_s,
        "max_concurrent_requests": m.max_concurrent_requests,
        "rtfx": 0.0,
    })
    if rps_change_events:
        out["rps_change_events"] = [dict(e) for e in rps_change_events]
    values: dict[str, list[float]] = {"ttft": m.ttfts, "tpot": m.tpots, "itl": m.itls,
                                      "e2el": m.e2els}
    if header.max_concurrency is not None:
        ok = [o for o in outputs if o.success]
        values["client_queue_time"] = [o.client_queue_time for o in ok]
        if not math.isinf(header.request_rate):
            values["e2el_including_client_queue"] = [o.latency + o.client_queue_time
                                                     for o in ok]
    for key in METRICS:
        if key not in percentile_metrics or key not in values:
            continue
        s = _stats(values[key], percentiles)
        out[f"mean_{key}_ms"] = s["mean"]
        out[f"median_{key}_ms"] = s["median"]
        out[f"std_{key}_ms"] = s["std"]
        for p, v in s["percentiles"]:
            out[f"p{percentile_word(p)}_{key}_ms"] = v
    if not detailed:
        for name in DETAIL_ARRAYS:
            out.pop(name, None)
    return out


def format_result(result: Mapping[str, Any]) -> str:
    """The "Serving Benchmark Result" table of ``result``, line for line as vllm prints it
    (``reports.stats.format_summary`` with the client's queueing metrics)."""
    return format_summary(result, METRICS)
