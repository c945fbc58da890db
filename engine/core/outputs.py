"""The records that cross the core's boundaries: scheduler → executor → scheduler → front end.

``SchedulerOutput`` is what a worker (real or simulated) receives for one step; ``BatchShape``
is the part a cost model may see (never Request objects); ``ModelRunnerOutput`` comes back from
the executor; ``EngineCoreOutput`` goes to the output path, one per request with new tokens or a
finish. Field names follow vLLM V1.

The records built once per step or per request write their ``__init__`` out instead of letting
``dataclass`` generate it: under ``twinserve compile`` (mypyc) a generated ``__init__`` runs as
interpreted code (≈ 0.5 µs; ≈ 1.2 µs frozen), a written one is compiled (≈ 0.07 µs). Frozen
records assign through ``object.__setattr__``, which mypyc compiles to a plain store and which
keeps them immutable afterwards. ``tests/core/test_record_inits.py`` checks that every written
``__init__`` takes exactly the dataclass fields, in order, with their defaults.
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
    POLICY = "policy"  # the scheduling policy said wait (``engine/core/policy.py``)


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

    def __init__(
        self,
        num_reqs: int,
        num_tokens: int,
        prefill_query_lens: tuple[int, ...],
        prefill_context_lens: tuple[int, ...],
        num_decode_reqs: int,
        decode_context_sum: int,
        decode_context_max: int,
        num_sampling_reqs: int,
    ) -> None:
        object.__setattr__(self, "num_reqs", num_reqs)
        object.__setattr__(self, "num_tokens", num_tokens)
        object.__setattr__(self, "prefill_query_lens", prefill_query_lens)
        object.__setattr__(self, "prefill_context_lens", prefill_context_lens)
        object.__setattr__(self, "num_decode_reqs", num_decode_reqs)
        object.__setattr__(self, "decode_context_sum", decode_context_sum)
        object.__setattr__(self, "decode_context_max", decode_context_max)
        object.__setattr__(self, "num_sampling_reqs", num_sampling_reqs)

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

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int] | None,
        num_prompt_tokens: int,
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        block_ids: list[int],
        num_computed_tokens: int,
    ) -> None:
        object.__setattr__(self, "req_id", req_id)
        object.__setattr__(self, "prompt_token_ids", prompt_token_ids)
        object.__setattr__(self, "num_prompt_tokens", num_prompt_tokens)
        object.__setattr__(self, "sampling_params", sampling_params)
        object.__setattr__(self, "eos_token_id", eos_token_id)
        object.__setattr__(self, "block_ids", block_ids)
        object.__setattr__(self, "num_computed_tokens", num_computed_tokens)


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

    def __init__(
        self,
        req_ids: list[str] | None = None,
        resumed_req_ids: set[str] | None = None,
        new_block_ids: list[list[int] | None] | None = None,
        num_computed_tokens: list[int] | None = None,
        num_output_tokens: list[int] | None = None,
        all_token_ids: dict[str, list[int]] | None = None,
    ) -> None:
        # None stands for each field's default_factory (a fresh empty container)
        self.req_ids = [] if req_ids is None else req_ids
        self.resumed_req_ids = set() if resumed_req_ids is None else resumed_req_ids
        self.new_block_ids = [] if new_block_ids is None else new_block_ids
        self.num_computed_tokens = [] if num_computed_tokens is None else num_computed_tokens
        self.num_output_tokens = [] if num_output_tokens is None else num_output_tokens
        self.all_token_ids = {} if all_token_ids is None else all_token_ids

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
    rejected: dict[str, str] | None = None  # shed by the policy this step: req_id -> reason

    def __init__(
        self,
        step_id: int,
        scheduled_new_reqs: list[NewRequestData],
        scheduled_cached_reqs: CachedRequestData,
        num_scheduled_tokens: dict[str, int],
        total_num_scheduled_tokens: int,
        partial_prefill_req_ids: set[str],
        preempted_req_ids: set[str],
        finished_req_ids: set[str],
        batch_shape: BatchShape,
        admission_blocker: AdmissionBlocker,
        rejected: dict[str, str] | None = None,
    ) -> None:
        self.step_id = step_id
        self.scheduled_new_reqs = scheduled_new_reqs
        self.scheduled_cached_reqs = scheduled_cached_reqs
        self.num_scheduled_tokens = num_scheduled_tokens
        self.total_num_scheduled_tokens = total_num_scheduled_tokens
        self.partial_prefill_req_ids = partial_prefill_req_ids
        self.preempted_req_ids = preempted_req_ids
        self.finished_req_ids = finished_req_ids
        self.batch_shape = batch_shape
        self.admission_blocker = admission_blocker
        self.rejected = rejected


@dataclass(slots=True)
class ModelRunnerOutput:
    """What the executor returns for one step."""

    sampled_token_ids: dict[str, list[int]]  # per request that sampled; others absent
    execute_time_s: float | None = None  # measured device time (real executors only)

    def __init__(
        self, sampled_token_ids: dict[str, list[int]], execute_time_s: float | None = None
    ) -> None:
        self.sampled_token_ids = sampled_token_ids
        self.execute_time_s = execute_time_s


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens and/or the finish of one request after a step."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    def __init__(
        self,
        req_id: str,
        new_token_ids: list[int],
        finish_reason: FinishReason | None = None,
        stop_reason: int | str | None = None,
    ) -> None:
        self.req_id = req_id
        self.new_token_ids = new_token_ids
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
