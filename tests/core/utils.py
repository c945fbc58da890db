"""Helpers for scheduler tests in vLLM's style: schedule → hand-made runner output → update.

They mirror vLLM's ``tests/v1/core/utils.py`` defaults (SCHEDULER_SPEC.md §3): max_num_seqs 16,
budget 8192, max_model_len = budget, block size 16, 10000 blocks, chunked prefill on, prefix
caching on, EOS 50256; requests of 10 tokens ``[i]*10``, max_tokens 16, ids "0", "1", ….
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.hashing import TokenBlockHasher
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, SamplingParams
from engine.core.scheduler import Scheduler

EOS_TOKEN_ID = 50256


def create_scheduler(
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    max_model_len: int | None = None,
    enable_prefix_caching: bool = True,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    num_blocks: int = 10000,
    block_size: int = 16,
    policy: str = "fcfs",
    scheduler_reserve_full_isl: bool = True,
    async_scheduling: bool = False,
    watermark: float = 0.0,
) -> Scheduler:
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len or max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=policy,  # type: ignore[arg-type]
            scheduler_reserve_full_isl=scheduler_reserve_full_isl,
            async_scheduling=async_scheduling,
        ),
        cache=CacheConfig(
            num_gpu_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            watermark=watermark,
        ),
    )
    return Scheduler(config)


def create_requests(
    num_requests: int,
    num_tokens: int = 10,
    *,
    max_tokens: int = 16,
    min_tokens: int = 0,
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
    same_prompt: bool = False,
    block_size: int = 16,
    prompt_token_ids: list[list[int]] | None = None,
    priorities: list[int] | None = None,
    arrival_times: list[float] | None = None,
    req_ids: list[str] | None = None,
    eos_token_id: int | None = EOS_TOKEN_ID,
) -> list[Request]:
    hasher = TokenBlockHasher(block_size)
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=ignore_eos,
    )
    requests = []
    for i in range(num_requests):
        if prompt_token_ids is not None:
            prompt = prompt_token_ids[i]
        else:
            prompt = [0] * num_tokens if same_prompt else [i] * num_tokens
        requests.append(
            Request(
                req_ids[i] if req_ids else str(i),
                sampling_params=params,
                prompt_token_ids=prompt,
                arrival_time=arrival_times[i] if arrival_times else float(i),
                priority=priorities[i] if priorities else 0,
                eos_token_id=eos_token_id,
                block_hasher=hasher,
            )
        )
    return requests


def sample_all(out: SchedulerOutput, token_id: int = 0) -> ModelRunnerOutput:
    """Every request that finished its prefill samples ``token_id``."""
    return ModelRunnerOutput(
        {r: [token_id] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids}
    )


def make_output(sampled: dict[str, list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(dict(sampled))


def step(scheduler: Scheduler, token_id: int = 0) -> SchedulerOutput:
    """schedule() then update_from_output() with every sampling request emitting token_id."""
    out = scheduler.schedule()
    scheduler.update_from_output(out, sample_all(out, token_id))
    return out
