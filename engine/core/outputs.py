"""The records that cross the core's boundaries: scheduler → executor → scheduler → front end.

``SchedulerOutput`` is what a worker (real or simulated) receives for one step; ``BatchShape``
is the part a cost model may see (never Request objects); ``ModelRunnerOutput`` comes back from
the executor; ``EngineCoreOutput`` goes to the output path, one per request with new tokens or a
finish. Field names follow vLLM V1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.core.request import FinishReason, SamplingParams


class AdmissionBlocker(enum.StrEnum):
    """Why a step stopped admitting waiting requests (for the "scheduler waiting" breakdown)."""

    NONE = ""  # nothing was left waiting (or only requests with outputs still in flight)
    TOKEN_BUDGET = "token_budget"  # the step's token budget ran out
    MAX_NUM_SEQS = "max_num_seqs"  # RUNNING already held max_num_seqs requests
    KV_CACHE = "kv_cache"  # the head request's KV blocks did not fit
    PREEMPTION = "preemption"  # running requests were preempted: no admissions this step


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one step computes, in the terms a cost model needs.

    Each scheduled request contributes ``query_len`` new tokens on top of ``context_len`` tokens
    already in its KV cache. Requests with ``query_len == 1`` are *decodes* (only their context
    sum/max/count are kept); the others are prefill chunks, listed in scheduling order.
    """

    num_reqs: int  # scheduled requests
    num_tokens: int  # scheduled tokens (= rows of the flattened batch)
    prefill_query_lens: tuple[int, ...]  # new tokens of each prefill chunk
    prefill_context_lens: tuple[int, ...]  # cached tokens before each prefill chunk
    num_decode_reqs: int  # requests computing exactly one token
    decode_context_sum: int  # Σ cached tokens before each decode
    decode_context_max: int  # longest decode context (0 if none)
    num_sampling_reqs: int  # requests that sample a token this step (LM head rows)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_reqs

    @property
    def num_prefill_reqs(self) -> int:
        return len(self.prefill_query_lens)

    @staticmethod
    def empty() -> BatchShape:
        return BatchShape(0, 0, (), (), 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class NewRequestData:
    """A request the worker has not seen yet (first admission)."""

    req_id: str
    prompt_token_ids: list[int] | None  # None for simulated requests without token ids
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None  # None when ignore_eos
    block_ids: list[int]  # the whole block table (prefix hits first)
    num_computed_tokens: int  # prefix-cache hit, in tokens


@dataclass(slots=True)
class CachedRequestData:
    """Requests the worker already knows: running ones first, then resumed ones."""

    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)  # block table restarts from scratch
    new_block_ids: list[list[int] | None] = field(default_factory=list)  # appended blocks
    num_computed_tokens: list[int] = field(default_factory=list)  # before this step
    num_output_tokens: list[int] = field(default_factory=list)  # incl. async placeholders
    # Full token ids of requests not scheduled in the previous step (resumed ones included).
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    """One step's schedule, as the worker receives it."""

    step_id: int  # index of the schedule() call that produced it
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # insertion order: running, then new/resumed
    total_num_scheduled_tokens: int
    partial_prefill_req_ids: set[str]  # scheduled but still mid-prefill: sample nothing
    preempted_req_ids: set[str]  # preempted during this schedule()
    finished_req_ids: set[str]  # finished since the previous schedule(): drop worker state
    batch_shape: BatchShape
    admission_blocker: AdmissionBlocker  # why admissions stopped (NONE if the queue drained)


@dataclass(slots=True)
class ModelRunnerOutput:
    """What the executor returns for one step."""

    sampled_token_ids: dict[str, list[int]]  # per request that sampled; others absent
    execute_time_s: float | None = None  # measured device time (real executors only)


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens and/or the finish of one request after a step."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
