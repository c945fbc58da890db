"""Prometheus metrics with vLLM's names, for what twinserve serves.

Every API server process records into ``prometheus_client``'s multiprocess mode (each process
writes its own memory-mapped files in the directory ``PROMETHEUS_MULTIPROC_DIR`` names, which
the launcher creates fresh for each server and sets before any process starts), and
``GET /metrics`` on any API server aggregates all of them, as vLLM does with several API
servers:

* counters and histograms are summed over processes: each API server counts its own requests,
  and the engine's counter increments (prefix-cache queries and hits, preemptions) reach
  exactly one API server with each step;
* the engine's gauges (running, waiting, KV-cache usage) are ``mostrecent``: the value the
  engine reported last, whichever API server received it.

Labels are vLLM's: ``model_name`` and ``engine`` (the EngineCore index).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from engine.entrypoints.wire import RequestTiming, SchedulerStats

#: vLLM's finish reasons, the values of ``vllm:request_success``'s ``finished_reason`` label.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


_FAMILIES: dict[tuple[str, tuple[float, ...]], Gauge | Counter | Histogram] = {}


def _family(kind: type[Gauge] | type[Counter] | type[Histogram], name: str, doc: str,
            names: list[str], buckets: tuple[float, ...] = ()) -> Any:
    """The process's one metric family of this name (created on first use), so that every
    engine's ``ServerMetrics`` labels children of the same families."""
    key = (name, buckets)
    family = _FAMILIES.get(key)
    if family is None:
        if kind is Gauge:
            family = Gauge(name, doc, names, multiprocess_mode="mostrecent")
        elif kind is Histogram:
            family = Histogram(name, doc, names, buckets=buckets)
        else:
            family = Counter(name, doc, names)
        _FAMILIES[key] = family
    return family


class ServerMetrics:
    """The metrics of one API server process about one engine (label values fixed at
    creation; with data parallelism there is one per engine, labelled by its index)."""

    def __init__(self, model_name: str, max_model_len: int, engine_index: int = 0) -> None:
        names = ["model_name", "engine"]
        values = (model_name, str(engine_index))

        def gauge(name: str, doc: str) -> Gauge:
            family: Gauge = _family(Gauge, name, doc, names)
            return family.labels(*values)

        def counter(name: str, doc: str) -> Counter:
            family: Counter = _family(Counter, name, doc, names)
            return family.labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            family: Histogram = _family(Histogram, name, doc, names,
                                        tuple(float(b) for b in buckets))
            return family.labels(*values)

        self.running = gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.")
        for g in (self.running, self.waiting, self.kv_usage):
            g.set(0)  # an idle engine, until its first report
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        success: Counter = _family(Counter, "vllm:request_success",
                                   "Count of successfully processed requests.",
                                   [*names, "finished_reason"])
        self.success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        token_buckets = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.",
            token_buckets)
        self.request_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            token_buckets)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.",
                             TOKEN_LATENCY_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.",
                                REQUEST_LATENCY_BUCKETS)

    def record_stats(self, stats: SchedulerStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        if stats.prefix_cache_queries:
            self.prefix_queries.inc(stats.prefix_cache_queries)
        if stats.prefix_cache_hits:
            self.prefix_hits.inc(stats.prefix_cache_hits)
        if stats.num_preemptions:
            self.preemptions.inc(stats.num_preemptions)

    def record_tokens(
        self, num_new_tokens: int, num_prompt_tokens: int, ttft_s: float | None,
        itl_s: float | None,
    ) -> None:
        """New output tokens of one request reached its API server: the first ones (with the
        request's TTFT; its prompt is then processed) or later ones (with the time since the
        previous ones)."""
        self.generation_tokens.inc(num_new_tokens)
        if ttft_s is not None:
            self.prompt_tokens.inc(num_prompt_tokens)
            self.ttft.observe(ttft_s)
        if itl_s is not None:
            self.itl.observe(itl_s)

    def record_finished(
        self,
        finish_reason: str,
        num_prompt_tokens: int,
        num_output_tokens: int,
        max_tokens: int,
        e2e_s: float,
        first_token_latency_s: float | None,
        timing: RequestTiming | None,
    ) -> None:
        """A request the engine ran ended."""
        counter = self.success.get(finish_reason)
        if counter is not None:
            counter.inc()
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_output_tokens)
        self.request_max_tokens.observe(max_tokens)
        self.e2e.observe(e2e_s)
        if first_token_latency_s is not None and num_output_tokens > 1:
            self.tpot.observe((e2e_s - first_token_latency_s) / (num_output_tokens - 1))
        if timing is None:
            return
        for histogram, start, end in (
            (self.queue, timing.queued_s, timing.scheduled_s),
            (self.prefill, timing.scheduled_s, timing.first_token_s),
            (self.decode, timing.first_token_s, timing.last_token_s),
            (self.inference, timing.scheduled_s, timing.last_token_s),
        ):
            interval = end - start
            if interval == interval:  # NaN: the request never reached that stage
                histogram.observe(max(interval, 0.0))


def render_metrics() -> tuple[bytes, str]:
    """All API servers' metrics in Prometheus' text format, and its content type."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry), CONTENT_TYPE_LATEST
