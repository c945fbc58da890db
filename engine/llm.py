"""Offline inference: ``LLM(model=DIR, ...).generate(prompts, SamplingParams)``.

Responsibility: assemble the real engine from one frozen ``EngineArgs`` — model config →
scheduler config (``EngineKnobs.scheduler_config``, the resolver the simulator uses too) →
``TorchExecutor`` (which sizes the KV cache) → the core's ``CacheConfig`` → ``EngineCore`` —
and run batches of prompts to completion through ``EngineLoop`` (the same ``begin_step`` /
``finish_step`` protocol as every driver, async batch queue included) and the
``OutputProcessor`` (detokenization, stop strings).

``RealEngine`` is the assembled engine without the offline loop, for drivers that add requests
over time (``twinserve run-real``): build it with ``EngineArgs(...).build()``, turn prompts into
core ``Request``s with ``make_request`` (validation, EOS ids, block hasher), and drive
``EngineLoop(engine.core, engine.executor)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core.config import (
    CLASS_DEFAULT_BUDGETS,
    ConfigError,
    EngineConfig,
    EngineKnobs,
    SchedulerConfig,
)
from engine.core.engine_core import EngineCore
from engine.core.events import EventKind
from engine.core.hashing import TokenBlockHasher
from engine.core.parallel import ParallelConfig, check_device_count
from engine.core.policy import StreamInfo
from engine.core.request import Request, SamplingParams
from engine.core.slo import SLOClass
from engine.serve.engine_loop import EngineLoop
from engine.serve.frontend import Tokenizer, generation_eos_token_ids
from engine.serve.output_processor import OutputProcessor, RequestOutput
from engine.worker.config import LoadFormat, WorkerConfig
from engine.worker.executor import TorchExecutor
from engine.worker.loader import resolve_device
from engine.worker.model_config import ModelConfig, load_model_config
from workload.admission import PromptError, validate_prompt

if TYPE_CHECKING:
    from engine.worker.multiproc_executor import MultiprocExecutor

    #: The executors a real engine runs on: in this process, or one worker process per rank.
    WorkerExecutor = TorchExecutor | MultiprocExecutor

#: The real engine's knobs when none are given: vLLM's, but one batch in flight (the executor
#: runs in-process and synchronously, so a second batch would only wait for the first).
REAL_ENGINE_KNOBS = EngineKnobs(async_scheduling=False)

Prompt = str | Sequence[int] | dict[str, Any]


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """Every knob of a real engine: the engine knobs both worlds share (``engine``), and what
    only a real engine has (checkpoint, device, KV memory). ``None`` means "derive it"."""

    model: str  # local checkpoint directory
    tokenizer: str | None = None  # directory with tokenizer.json; None = the model directory
    dtype: str = "auto"  # auto (config.json), float32, float16, bfloat16
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    max_model_len: int | None = None  # None = config.json's max_position_embeddings
    num_gpu_blocks: int | None = None  # exact KV block count (incl. the null block)
    kv_cache_memory: int | None = None  # KV bytes; None = profile (CUDA) / 1 GiB (CPU)
    gpu_memory_utilization: float = 0.9
    load_format: LoadFormat = "safetensors"  # "dummy" = random weights
    attention_backend: str | None = None  # None = kernels.select_backend default
    seed: int = 0  # engine-wide sampling seed
    tensor_parallel_size: int = 1  # ranks per pipeline stage
    pipeline_parallel_size: int = 1  # pipeline stages (one batch in flight per stage)
    # "uni": the model in this process (one rank); "mp": one worker process per rank;
    # None: vLLM's choice (mp when TP × PP > 1)
    distributed_executor_backend: str | None = None
    worker_cpu_threads: int = 1  # torch CPU threads of each worker process (mp on CPU)
    # budgets, chunking, policy, async scheduling, block size, prefix caching; unset budgets
    # take vLLM's class defaults (CLASS_DEFAULT_BUDGETS)
    engine: EngineKnobs = REAL_ENGINE_KNOBS

    def __post_init__(self) -> None:
        self.worker_config()  # validates the worker knobs
        parallel = self.parallel_config  # validates the degrees
        if self.distributed_executor_backend not in (None, "uni", "mp"):
            raise ConfigError(
                "distributed_executor_backend must be 'uni' or 'mp', got "
                f"{self.distributed_executor_backend!r}"
            )
        if self.executor_backend == "uni" and parallel.world_size > 1:
            raise ConfigError(
                f"the uniprocess executor runs one rank; TP × PP = {parallel.world_size} needs "
                "the multiprocess executor (mp)"
            )
        if parallel.pipeline_parallel_size > 1 and self.engine.async_scheduling:
            raise ConfigError(
                "async scheduling is not supported with pipeline parallelism (vLLM 0.33's V1 "
                "model runner refuses it too); turn async scheduling off"
            )

    @property
    def parallel_config(self) -> ParallelConfig:
        return ParallelConfig(tensor_parallel_size=self.tensor_parallel_size,
                              pipeline_parallel_size=self.pipeline_parallel_size)

    @property
    def executor_backend(self) -> str:
        """``uni`` or ``mp`` (vLLM's default: mp when TP × PP > 1)."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "mp" if self.parallel_config.world_size > 1 else "uni"

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """vLLM's flat spelling, ``LLM(model, max_num_seqs=…, device=…)``: the engine knobs
        among ``kwargs`` go to ``engine`` (over ``REAL_ENGINE_KNOBS``), the rest are fields."""
        knob_names = {f.name for f in dataclasses.fields(EngineKnobs)}
        knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in knob_names}
        return cls(model=model, engine=dataclasses.replace(REAL_ENGINE_KNOBS, **knobs), **kwargs)

    def scheduler_config(self, model_config: ModelConfig) -> SchedulerConfig:
        limit = model_config.max_position_embeddings
        max_model_len = self.max_model_len or limit
        if max_model_len > limit:
            raise ConfigError(
                f"max_model_len={max_model_len} exceeds the model's max_position_embeddings "
                f"({limit})"
            )
        return self.engine.scheduler_config(max_model_len, CLASS_DEFAULT_BUDGETS)

    def worker_config(self) -> WorkerConfig:
        return WorkerConfig(
            model=self.model, dtype=self.dtype, device=self.device, load_format=self.load_format,
            kv_cache_memory_bytes=self.kv_cache_memory,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks,
            attention_backend=self.attention_backend, seed=self.seed,
        )

    def build(
        self, stream: StreamInfo | None = None, *, data_parallel_rank: int = 0
    ) -> RealEngine:
        """Load the model (on this process, or on one worker process per rank), size the KV
        cache and create the engine core (its scheduling policy built with what ``stream`` says
        of the requests to come). Replica ``data_parallel_rank`` takes the devices after the
        previous replicas' (``engine.core.parallel``'s rank order)."""
        model_config = load_model_config(self.model)
        parallel = self.parallel_config
        parallel.check_model(model_config.num_attention_heads, model_config.num_key_value_heads,
                             model_config.num_hidden_layers, self.model)
        scheduler = self.scheduler_config(model_config)
        executor: WorkerExecutor
        if self.executor_backend == "uni":
            executor = TorchExecutor(self.worker_config(), scheduler, self.engine.block_size)
        else:
            from engine.worker.multiproc_executor import MultiprocExecutor

            device = resolve_device(self.device)
            first = data_parallel_rank * parallel.world_size
            if device.type == "cuda":
                check_device_count(parallel.world_size * (data_parallel_rank + 1),
                                   torch_cuda_device_count())
                first += device.index or 0
            executor = MultiprocExecutor(
                self.worker_config(), scheduler, self.engine.block_size, parallel,
                device_type=device.type, first_device=first, cpu_threads=self.worker_cpu_threads,
            )
        engine_config = EngineConfig(
            scheduler=scheduler, cache=self.engine.cache_config(executor.num_gpu_blocks),
            pipeline_parallel_size=parallel.pipeline_parallel_size,
        )
        tokenizer_dir = self.tokenizer or self.model
        tokenizer = (
            Tokenizer.from_dir(tokenizer_dir) if Tokenizer.has_tokenizer(tokenizer_dir) else None
        )
        return RealEngine(self, model_config, engine_config,
                          EngineCore(engine_config, stream=stream), executor, tokenizer, stream)


class RealEngine:
    """The assembled real engine: core, executor, tokenizer and request construction."""

    def __init__(
        self,
        args: EngineArgs,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        core: EngineCore,
        executor: WorkerExecutor,
        tokenizer: Tokenizer | None,
        stream: StreamInfo | None = None,
    ) -> None:
        self.args = args
        self.stream = stream  # what the policy was told of the requests (``new_core``)
        self.model_config = model_config
        self.engine_config = engine_config
        self.core = core
        self.executor = executor
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        if eos is None and model_config.eos_token_ids:
            eos = model_config.eos_token_ids[0]
        self.eos_token_id: int | None = eos
        extra = generation_eos_token_ids(args.model) or model_config.eos_token_ids
        self.extra_stop_token_ids = tuple(t for t in dict.fromkeys(extra) if t != eos)
        cache = engine_config.cache
        self.block_hasher = (
            TokenBlockHasher(cache.block_size) if cache.enable_prefix_caching else None
        )

    def new_core(self) -> EngineCore:
        """A fresh engine core on this engine's config, with a fresh scheduling policy."""
        return EngineCore(self.engine_config, stream=self.stream)

    def make_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        tenant: str = "",
        slo: SLOClass | None = None,
    ) -> Request:
        """A validated core ``Request`` with the model's EOS and generation-config stop ids."""
        validate_prompt(
            prompt_token_ids,
            vocab_size=self.model_config.vocab_size,
            max_model_len=self.engine_config.scheduler.max_model_len,
        )
        if self.extra_stop_token_ids and not params.ignore_eos:
            stops = tuple(dict.fromkeys((*params.stop_token_ids, *self.extra_stop_token_ids)))
            params = dataclasses.replace(params, stop_token_ids=stops)
        return Request(
            req_id,
            sampling_params=params,
            prompt_token_ids=prompt_token_ids,
            arrival_time=arrival_time,
            priority=priority,
            eos_token_id=self.eos_token_id,
            block_hasher=self.block_hasher,
            tenant=tenant,
            slo=slo,
        )


class LLM:
    """Generate for batches of prompts on a local checkpoint (vLLM's offline ``LLM``)."""

    def __init__(self, model: str, clock: Callable[[], float] = time.perf_counter,
                 **engine_args: Any) -> None:
        self._start(EngineArgs.from_kwargs(model, **engine_args), clock)

    @classmethod
    def from_engine_args(
        cls, args: EngineArgs, clock: Callable[[], float] = time.perf_counter
    ) -> LLM:
        """An ``LLM`` on an engine described by one ``EngineArgs`` (what the CLI builds)."""
        llm = cls.__new__(cls)
        llm._start(args, clock)
        return llm

    def _start(self, args: EngineArgs, clock: Callable[[], float]) -> None:
        self.engine = args.build()
        self.clock = clock
        self.loop = EngineLoop(self.engine.core, self.engine.executor, clock)
        self._ids = itertools.count()

    @property
    def core(self) -> EngineCore:
        return self.engine.core

    @property
    def executor(self) -> WorkerExecutor:
        return self.engine.executor

    def get_tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in order. A prompt is a string, a list of token ids, or a
        dict with ``prompt`` or ``prompt_token_ids``."""
        arrival = self.clock()
        items = [self._tokenize(p) for p in _as_prompt_list(prompts)]
        return self._run(items, _per_prompt(sampling_params, len(items)), arrival)

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Apply the chat template to one conversation (or several), then generate."""
        arrival = self.clock()
        tokenizer = self._require_tokenizer("chat")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        items: list[tuple[str | None, list[int]]] = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(conversation, add_generation_prompt)  # type: ignore[arg-type]
            items.append((text, tokenizer.encode(text, add_special_tokens=False)))
        return self._run(items, _per_prompt(sampling_params, len(items)), arrival)

    def shutdown(self) -> None:
        self.engine.executor.shutdown()

    # -- internals ------------------------------------------------------------------------------
    def _require_tokenizer(self, what: str) -> Tokenizer:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise PromptError(f"{what} needs a tokenizer, but the checkpoint has no tokenizer.json")
        return tokenizer

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return prompt, self._require_tokenizer("a text prompt").encode(prompt)
        return None, [int(t) for t in prompt]

    def _run(
        self,
        items: list[tuple[str | None, list[int]]],
        params: list[SamplingParams],
        arrival_s: float,
    ) -> list[RequestOutput]:
        """Run the batch to completion, writing the front-end events the simulator writes too:
        arrival (payload: prompt tokens), front-end start, tokenized, per-step delivery and
        the delivery of each finished request."""
        engine, clock, log = self.engine, self.clock, self.engine.core.event_log
        requests = [
            engine.make_request(str(next(self._ids)), ids, p, arrival_time=arrival_s)
            for (_, ids), p in zip(items, params, strict=True)
        ]
        processor = OutputProcessor(engine.tokenizer)
        for (text, ids), p, request in zip(items, params, requests, strict=True):
            processor.add_request(request.req_id, text, ids, p)
        tokenized_s = clock()
        for request in requests:
            log.record(request.req_id, EventKind.ARRIVAL, arrival_s, request.num_prompt_tokens)
            log.record(request.req_id, EventKind.FRONTEND_START, arrival_s)
            log.record(request.req_id, EventKind.TOKENIZED, tokenized_s)
            engine.core.add_request(request, clock())
        results: dict[str, RequestOutput] = {}
        while self.loop.has_work():
            outputs = self.loop.step()
            if not outputs:
                continue
            processed = processor.process_outputs(outputs)
            delivered_s = clock()
            if self.loop.applied_step_id is not None:
                log.record_delivery(self.loop.applied_step_id, delivered_s)
            for out in processed.finished:
                results[out.req_id] = out
                log.record(out.req_id, EventKind.DELIVERED, delivered_s)
            if processed.reqs_to_abort:
                engine.core.abort_requests(processed.reqs_to_abort, clock())
        return [results[r.req_id] for r in requests]


def torch_cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str | dict):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [items]  # one prompt given as token ids
    return items


def _per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    listed = list(params)
    if len(listed) != n:
        raise ConfigError(f"{len(listed)} sampling params for {n} prompts")
    return listed
