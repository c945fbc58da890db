"""``twinserve replay-schedule``: drive the engine core through a scripted workload, step by step.

The workload format and the record printed per step are those of the golden traces recorded
from vLLM 0.33.0 (shared/golden/README.md): requests arrive at given step numbers, every
scheduled request that completes its prefill samples its next scripted token, and each call of
the engine's step loop prints one JSON record. The loop drives ``EngineCore`` exactly as every
other driver does (``begin_step`` → executor → ``must_finish_step`` → ``finish_step``), with the
async batch queue when ``async_scheduling`` is on, and one batch per pipeline stage when a
workload's ``batch_queue_depth`` (with a synchronous scheduler) says so.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.errors import UserError
from engine.core.hashing import TokenBlockHasher
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.policy import SchedulingPolicy
from engine.core.request import Request, SamplingParams

#: Workload config keys and their defaults (those of the vLLM oracle that recorded the goldens).
CONFIG_DEFAULTS: dict[str, Any] = {
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 128,
    "block_size": 16,
    "num_gpu_blocks": 1000,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "policy": "fcfs",
    "watermark": 0.0,
    "max_model_len": 8192,
    "scheduler_reserve_full_isl": True,
    "async_scheduling": False,
    "output_token_id": 7,
    "eos_token_id": None,
    "max_steps": 10000,
    # vLLM sizes the batch queue by the executor's max_concurrent_batches: with a synchronous
    # scheduler a depth > 1 is the pipeline-parallel degree (None: 1, or 2 under async)
    "batch_queue_depth": None,
}
REQUEST_KEYS = frozenset(
    {
        "id", "arrival_step", "arrival_time", "prompt_token_ids", "prompt_len", "prompt_fill",
        "max_tokens", "priority", "min_tokens", "stop_token_ids", "ignore_eos",
        "output_token_ids", "eos_token_id",
    }
)


class WorkloadError(UserError):
    """A workload file is malformed; the message names the file, the request and the field."""


@dataclass(frozen=True, slots=True)
class ScriptedRequest:
    """One request of a replay workload, with the tokens it will emit."""

    request: Request
    arrival_step: int
    output_token_ids: tuple[int, ...]


@dataclass(slots=True)
class ReplayWorkload:
    engine_config: EngineConfig
    requests: list[ScriptedRequest]
    output_token_id: int
    max_steps: int
    emitted: dict[str, int] = field(default_factory=dict)


def _int(value: Any, what: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{what} must be >= {minimum}, got {value}")
    return value


def _token_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise WorkloadError(f"{what} must be a list of integers")
    return value


def _build_request(spec: Any, index: int, cfg: dict[str, Any], hasher: TokenBlockHasher | None,
                   where: str) -> ScriptedRequest:
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: requests[{index}] must be an object")
    unknown = sorted(set(spec) - REQUEST_KEYS)
    if unknown:
        raise WorkloadError(
            f"{where}: requests[{index}] has unknown key(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(REQUEST_KEYS))}"
        )
    if "id" not in spec:
        raise WorkloadError(f"{where}: requests[{index}] has no 'id'")
    req_id = str(spec["id"])
    what = f"{where}: request {req_id!r}"
    if "prompt_token_ids" in spec:
        prompt = _token_list(spec["prompt_token_ids"], f"{what} prompt_token_ids")
    elif "prompt_len" in spec:
        n = _int(spec["prompt_len"], f"{what} prompt_len", 1)
        if "prompt_fill" in spec:
            prompt = [_int(spec["prompt_fill"], f"{what} prompt_fill")] * n
        else:
            prompt = [1000 + index * 7919 + k for k in range(n)]
    else:
        raise WorkloadError(f"{what} needs 'prompt_token_ids' or 'prompt_len'")
    if not prompt:
        raise WorkloadError(f"{what} has an empty prompt")
    arrival_step = _int(spec.get("arrival_step", 0), f"{what} arrival_step", 0)
    max_tokens = _int(spec.get("max_tokens", 16), f"{what} max_tokens", 1)
    min_tokens = _int(spec.get("min_tokens", 0), f"{what} min_tokens", 0)
    stop_ids = tuple(_token_list(spec.get("stop_token_ids") or [], f"{what} stop_token_ids"))
    ignore_eos = spec.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise WorkloadError(f"{what} ignore_eos must be true or false, got {ignore_eos!r}")
    try:
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=min_tokens, stop_token_ids=stop_ids,
            ignore_eos=ignore_eos,
        )
    except ValueError as exc:
        raise WorkloadError(f"{what}: {exc}") from None
    raw_arrival = spec.get("arrival_time", arrival_step + index * 1e-6)
    if isinstance(raw_arrival, bool) or not isinstance(raw_arrival, int | float):
        raise WorkloadError(f"{what} arrival_time must be a number, got {raw_arrival!r}")
    arrival_time = float(raw_arrival)
    request = Request(
        req_id,
        sampling_params=params,
        prompt_token_ids=prompt,
        arrival_time=arrival_time,
        priority=_int(spec.get("priority", 0), f"{what} priority"),
        eos_token_id=spec.get("eos_token_id", cfg["eos_token_id"]),
        block_hasher=hasher,
    )
    outputs = _token_list(spec.get("output_token_ids", []), f"{what} output_token_ids")
    return ScriptedRequest(request, arrival_step, tuple(outputs))


def load_workload(path: str | Path) -> ReplayWorkload:
    """Read and validate a workload file; raises WorkloadError naming what is wrong."""
    where = str(path)
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as exc:
        raise WorkloadError(f"cannot read {where}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("requests"), list):
        raise WorkloadError(f"{where}: expected an object with a 'requests' list")
    given = raw.get("config", {})
    if not isinstance(given, dict):
        raise WorkloadError(f"{where}: 'config' must be an object")
    unknown = sorted(set(given) - set(CONFIG_DEFAULTS))
    if unknown:
        raise WorkloadError(
            f"{where}: unknown config key(s) {', '.join(unknown)}; "
            f"valid: {', '.join(CONFIG_DEFAULTS)}"
        )
    cfg = {**CONFIG_DEFAULTS, **given}
    if "max_num_seqs" not in given:
        cfg["max_num_seqs"] = min(cfg["max_num_seqs"], cfg["max_num_batched_tokens"])
    try:
        engine_config = EngineConfig(
            pipeline_parallel_size=_pipeline_depth(cfg, where),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=cfg["max_num_batched_tokens"],
                max_num_seqs=cfg["max_num_seqs"],
                max_model_len=cfg["max_model_len"],
                enable_chunked_prefill=cfg["enable_chunked_prefill"],
                long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
                policy=cfg["policy"],
                scheduler_reserve_full_isl=cfg["scheduler_reserve_full_isl"],
                async_scheduling=cfg["async_scheduling"],
            ),
            cache=CacheConfig(
                num_gpu_blocks=cfg["num_gpu_blocks"],
                block_size=cfg["block_size"],
                enable_prefix_caching=cfg["enable_prefix_caching"],
                watermark=cfg["watermark"],
            ),
        )
    except ConfigError as exc:
        raise WorkloadError(f"{where}: {exc}") from None
    hasher = TokenBlockHasher(cfg["block_size"]) if cfg["enable_prefix_caching"] else None
    requests = [
        _build_request(spec, i, cfg, hasher, where) for i, spec in enumerate(raw["requests"])
    ]
    ids = [r.request.req_id for r in requests]
    if len(set(ids)) != len(ids):
        raise WorkloadError(f"{where}: request ids must be unique")
    requests.sort(key=lambda r: r.arrival_step)  # stable: list order within a step
    return ReplayWorkload(
        engine_config, requests, _int(cfg["output_token_id"], "output_token_id"),
        _int(cfg["max_steps"], "max_steps", 1),
    )


def _pipeline_depth(cfg: dict[str, Any], where: str) -> int:
    """The pipeline-parallel degree a workload's ``batch_queue_depth`` stands for: vLLM's
    batch queue is 2 deep under async scheduling and one batch per stage otherwise."""
    depth = cfg["batch_queue_depth"]
    if depth is None:
        return 1
    depth = _int(depth, f"{where}: batch_queue_depth", 1)
    if cfg["async_scheduling"]:
        if depth != 2:
            raise WorkloadError(
                f"{where}: batch_queue_depth {depth} with async_scheduling: vLLM's async batch "
                "queue is 2 deep (pipeline parallelism runs a synchronous scheduler)"
            )
        return 1
    return depth


class ScriptedExecutor:
    """Returns each sampling request's next scripted token (or the default output token)."""

    def __init__(self, workload: ReplayWorkload) -> None:
        self._scripts = {r.request.req_id: r.output_token_ids for r in workload.requests}
        self._emitted = dict.fromkeys(self._scripts, 0)
        self._default = workload.output_token_id

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        sampled: dict[str, list[int]] = {}
        for req_id in sched_out.num_scheduled_tokens:
            if req_id in sched_out.partial_prefill_req_ids:
                continue
            i = self._emitted[req_id]
            self._emitted[req_id] = i + 1
            script = self._scripts[req_id]
            sampled[req_id] = [script[i] if i < len(script) else self._default]
        return ModelRunnerOutput(sampled)


def replay(
    workload: ReplayWorkload, policy: SchedulingPolicy | None = None
) -> Iterator[dict[str, Any]]:
    """Yield one golden-format record per call of the engine's step loop (with ``policy``,
    default the workload's own: vLLM's FCFS or priority)."""
    core = EngineCore(workload.engine_config, policy=policy)
    executor = ScriptedExecutor(workload)
    pending = deque(workload.requests)
    results: dict[int, Any] = {}
    for step in range(workload.max_steps):
        while pending and pending[0].arrival_step <= step:
            core.add_request(pending.popleft().request, float(step))
        if not pending and not core.has_work():
            break
        record: dict[str, Any] = {
            "step": step, "scheduled": {}, "total": 0, "new": {}, "resumed": [], "preempted": [],
        }
        out = core.begin_step(float(step))
        if out is not None:
            results[out.step_id] = executor.execute_model(out)
            cached = out.scheduled_cached_reqs
            record.update(
                scheduled=dict(out.num_scheduled_tokens),
                total=out.total_num_scheduled_tokens,
                new={n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs},
                resumed=sorted(cached.resumed_req_ids),
                preempted=sorted(out.preempted_req_ids),
            )
        finished: list[list[str]] = []
        if core.must_finish_step():
            oldest = core.oldest_in_flight()
            for o in core.finish_step(oldest, results.pop(oldest.step_id), float(step)):
                if o.finish_reason is not None:
                    finished.append([o.req_id, str(o.finish_reason)])
        scheduler = core.scheduler
        record["finished"] = finished
        record["free_blocks"] = scheduler.kv_cache_manager.get_num_free_blocks()
        record["running"] = [r.req_id for r in scheduler.running]
        yield record
