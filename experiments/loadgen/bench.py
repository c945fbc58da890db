"""``bench serve`` as a library call: a workload sent to a server, measured at the client.

``BenchOptions`` holds what ``vllm bench serve``'s client flags set (endpoint, backend, model,
sampling body, headers, concurrency, warm-ups); ``run_bench`` builds the workload from its
``WorkloadConfig`` — the same function ``twinserve simulate`` builds its stream with — turns it
into requests (``experiments.loadgen.inputs``), sends them (``experiments.loadgen.client``) and
returns a ``BenchRecord`` whose metadata describes the run. ``twinserve bench serve`` and
``twinserve validate`` both call it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import UserError
from experiments.loadgen.client import (
    BACKENDS,
    ProgressLine,
    RequestSpec,
    run_benchmark,
)
from experiments.loadgen.connection import Endpoint, HTTPStatusError, get_json
from experiments.loadgen.inputs import DEFAULT_PROMPT_VOCAB, bench_requests, prompts_of
from experiments.loadgen.run_dir import BenchRecord
from workload.config import WorkloadConfig


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """The client side of a benchmark (vllm bench serve's flags, plus ours)."""

    base_url: str
    endpoint: str = "/v1/completions"
    backend: str = "openai"
    model: str | None = None  # the served name; None: the first of GET /v1/models
    tokenizer: str | None = None  # directory with tokenizer.json (vocabulary, text, counts)
    label: str | None = None
    request_id_prefix: str = "bench-"
    ignore_eos: bool | None = None  # None: on for synthetic datasets (the stream's lengths)
    logprobs: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    num_warmups: int = 0
    token_seed: int | None = None  # seed of synthetic prompt tokens (None: the workload's)
    continuous_usage: bool = False
    insecure: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UserError(f"--backend {self.backend!r} is not supported; valid: "
                            f"{', '.join(BACKENDS)}")
        suffix = "chat/completions" if BACKENDS[self.backend] == "chat" else "completions"
        if not self.endpoint.endswith(suffix) or (
                suffix == "completions" and self.endpoint.endswith("chat/completions")):
            raise UserError(f"--backend {self.backend} needs an endpoint ending in {suffix} "
                            f"(got --endpoint {self.endpoint})")
        try:
            Endpoint.parse(self.base_url)
        except ValueError as exc:
            raise UserError(str(exc)) from None


def first_model(endpoint: Endpoint, headers: Mapping[str, str], insecure: bool) -> str:
    """The first model the server lists (``GET /v1/models``), as vllm bench asks it."""
    import asyncio

    try:
        data = asyncio.run(get_json(endpoint, "/v1/models", headers, insecure=insecure))
    except (OSError, HTTPStatusError, ValueError) as exc:
        raise UserError(f"cannot list the models at {endpoint.scheme}://{endpoint.host}:"
                        f"{endpoint.port}{endpoint.prefix}/v1/models ({exc}); is the server "
                        "running?") from None
    models = data.get("data") if isinstance(data, dict) else None
    if not models:
        raise UserError("the server lists no model: give --model")
    return str(models[0]["id"])


def load_tokenizer(path: str | None) -> Any:
    """The ``tokenizers`` tokenizer of a directory (None without one)."""
    if path is None:
        return None
    from engine.serve.frontend import Tokenizer

    return Tokenizer.from_dir(path)


def run_bench(options: BenchOptions, workload_cfg: WorkloadConfig,
              max_concurrency: int | None = None) -> BenchRecord:
    """Send ``workload_cfg``'s stream to the server and measure it (see the module doc)."""
    from workload.build import build_workload

    endpoint = Endpoint.parse(options.base_url)
    model = options.model or first_model(endpoint, options.headers, options.insecure)
    tokenizer = load_tokenizer(options.tokenizer)
    workload = build_workload(workload_cfg)
    api = BACKENDS[options.backend]
    vocab = tokenizer.vocab_size if tokenizer is not None else DEFAULT_PROMPT_VOCAB
    token_seed = workload_cfg.seed if options.token_seed is None else options.token_seed
    prompts = prompts_of(workload, vocab_size=vocab, token_seed=token_seed,
                         as_text=api == "chat", tokenizer=tokenizer)
    requests = bench_requests(workload, prompts, options.request_id_prefix)
    synthetic = workload_cfg.dataset_name != "sharegpt"
    ignore_eos = synthetic if options.ignore_eos is None else options.ignore_eos
    spec = RequestSpec(endpoint, options.endpoint, api, model, ignore_eos, options.logprobs,
                       options.continuous_usage, options.extra_body, options.headers)
    concurrency = workload_cfg.max_concurrency if max_concurrency is None else max_concurrency
    run = run_benchmark(spec, requests, max_concurrency=concurrency,
                        num_warmups=options.num_warmups,
                        progress=ProgressLine() if options.progress else None,
                        insecure=options.insecure)
    meta = _meta(options, model, workload_cfg, workload, run, ignore_eos)
    return BenchRecord(requests, run.outputs, run.start_s, run.end_s, meta)


def _meta(options: BenchOptions, model: str, workload_cfg: WorkloadConfig, workload: Any,
          run: Any, ignore_eos: bool) -> dict[str, Any]:
    from experiments.run_meta import bench_run_meta

    client = {"base_url": options.base_url, "endpoint": options.endpoint,
              "backend": options.backend, "model": model, "tokenizer": options.tokenizer,
              "ignore_eos": ignore_eos, "extra_body": dict(options.extra_body),
              "num_warmups": options.num_warmups, "request_id_prefix": options.request_id_prefix,
              "continuous_usage": options.continuous_usage}
    failed = sum(not o.success for o in run.outputs)
    meta = bench_run_meta(client=client, workload_cfg=workload_cfg, workload=workload,
                          model_id=model, num_failed=failed, duration_s=run.duration_s,
                          label=options.label)
    return meta.to_dict()


def print_failures(record: BenchRecord) -> None:
    """vllm bench's note on failed requests (at most 10 of them)."""
    failed = [o for o in record.outputs if not o.success]
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, out in enumerate(failed[:10]):
            print(f"Error {i}: {out.error}")


def describe_traffic(workload_cfg: WorkloadConfig, max_concurrency: int | None) -> None:
    """vllm bench's lines before the main run."""
    w = workload_cfg
    if w.ramp_up_strategy is not None:
        print(f"Traffic ramp-up strategy: {w.ramp_up_strategy}.")
        print(f"Will increase RPS from {w.ramp_up_start_rps} to {w.ramp_up_end_rps} RPS over "
              "the duration of the benchmark.")
    else:
        print(f"Traffic request rate: {w.request_rate}")
    distribution = "Poisson process" if w.burstiness == 1.0 else "Gamma distribution"
    print(f"Burstiness factor: {w.burstiness} ({distribution})")
    print(f"Maximum request concurrency: {max_concurrency}")
    sys.stdout.flush()
