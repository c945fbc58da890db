"""Requests as the scheduler sees them: tokens, sampling limits, status, and progress counters.

A ``Request`` is the core's mutable record of one generation. Its invariants (vLLM V1's):
``num_tokens == num_prompt_tokens + num_output_tokens``; ``num_computed_tokens`` counts the
tokens whose KV is (or is being) written, including in-flight ones under async scheduling;
``block_hashes`` hold one hash per *full* block of known tokens and grow as tokens arrive.

A request may carry real token ids (real runs, golden replays) or only a prompt length plus
precomputed block hashes (simulated workloads, traces such as Mooncake's ``hash_ids``): both feed
the same KV cache manager through the ``BlockHasher`` it was built with.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.core.hashing import PrecomputedBlockHasher, TokenBlockHasher

# Re-exported: validation stays interpreted when this module is compiled (see the module).
from engine.core.sampling_params import SamplingParams as SamplingParams
from engine.core.slo import SLOClass

if TYPE_CHECKING:
    from engine.core.hashing import BlockHash, BlockHasher


class RequestStatus(enum.IntEnum):
    """Life-cycle states in vLLM's order; every status after PREEMPTED is a finished one."""

    WAITING = 1
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = 2
    WAITING_FOR_REMOTE_KVS = 3
    WAITING_FOR_STREAMING_REQ = 4
    RUNNING = 5
    PREEMPTED = 6
    FINISHED_STOPPED = 7
    FINISHED_LENGTH_CAPPED = 8
    FINISHED_ABORTED = 9
    FINISHED_IGNORED = 10
    FINISHED_ERROR = 11
    FINISHED_REPETITION = 12

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


class FinishReason(enum.StrEnum):
    """Why a request ended, as the OpenAI API and vLLM report it."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    REPETITION = "repetition"


FINISH_REASON_OF_STATUS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


class Request:
    """One generation request inside the engine core (mutable; owned by the scheduler)."""

    __slots__ = (
        "_all_token_ids",
        "_output_fill",
        "_output_token_ids",
        "arrival_time",
        "block_hasher",
        "block_hashes",
        "block_ids",
        "drop_stale_output",
        "eos_token_id",
        "is_prefill_chunk",
        "max_tokens",
        "min_tokens",
        "num_cached_blocks",
        "num_computed_tokens",
        "num_in_flight_tokens",
        "num_output_placeholders",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_stale_output_tokens",
        "num_tokens",
        "priority",
        "prompt_token_ids",
        "req_id",
        "sampling_params",
        "slo",
        "status",
        "stop_reason",
        "stop_token_ids",
        "tenant",
    )

    def __init__(
        self,
        req_id: str,
        *,
        sampling_params: SamplingParams,
        prompt_token_ids: Sequence[int] | None = None,
        num_prompt_tokens: int | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
        eos_token_id: int | None = None,
        block_hasher: BlockHasher | None = None,
        tenant: str = "",
        slo: SLOClass | None = None,
    ) -> None:
        if prompt_token_ids is None and num_prompt_tokens is None:
            raise ValueError(f"request {req_id!r}: give prompt_token_ids or num_prompt_tokens")
        if prompt_token_ids is not None:
            self.prompt_token_ids: list[int] | None = list(prompt_token_ids)
            n = len(self.prompt_token_ids)
            if num_prompt_tokens is not None and num_prompt_tokens != n:
                raise ValueError(
                    f"request {req_id!r}: num_prompt_tokens={num_prompt_tokens} but "
                    f"{n} prompt_token_ids"
                )
            self._all_token_ids: list[int] | None = list(self.prompt_token_ids)
        else:
            assert num_prompt_tokens is not None
            self.prompt_token_ids = None
            self._all_token_ids = None
            n = num_prompt_tokens
        if n < 1:
            raise ValueError(f"request {req_id!r}: the prompt must hold at least one token")
        self.req_id = req_id
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.priority = priority
        self.tenant = tenant  # who sent it ("": unknown); read by policies and reports
        self.slo = slo  # its SLO class (None: no targets); read by policies
        self.eos_token_id = None if sampling_params.ignore_eos else eos_token_id
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids)
        self.max_tokens = sampling_params.max_tokens
        self.min_tokens = sampling_params.min_tokens
        self.num_prompt_tokens = n
        self.num_tokens = n
        # Outputs are a list, or, while every one so far is the same token (a simulated
        # request's placeholders: millions of them in a long run), only counted: the list is
        # None and ``_output_fill`` is that token. ``output_token_ids`` makes the list on demand.
        self._output_token_ids: list[int] | None = None
        self._output_fill = 0
        self.num_output_tokens = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0  # async: outputs scheduled but not yet returned
        self.num_in_flight_tokens = 0  # tokens of steps whose output is not processed yet
        self.num_stale_output_tokens = 0  # in-flight tokens that predate a preemption
        self.drop_stale_output = False
        self.is_prefill_chunk = False
        self.num_preemptions = 0
        # The KV cache manager is the only writer of these two: the request's block table and
        # how many of its leading full blocks are registered in the prefix-hash map.
        self.block_ids: list[int] = []
        self.num_cached_blocks = 0
        self.block_hasher = block_hasher
        self.block_hashes: list[BlockHash] = []
        self.hash_full_blocks()

    # -- tokens ---------------------------------------------------------------------------------
    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens, in order: the request's own list, which later outputs extend.
        Read-only, as vLLM's ``ConstantList``: outputs join through the ``append_*`` methods,
        which keep ``num_output_tokens`` and ``num_tokens``."""
        outputs = self._output_token_ids
        if outputs is None:
            outputs = self._output_token_ids = [self._output_fill] * self.num_output_tokens
        return outputs

    def _append_outputs(self, token_id: int, count: int) -> None:
        """``count`` copies of ``token_id`` join the outputs (counted while they repeat one
        token; listed from the first that differs)."""
        outputs = self._output_token_ids
        if outputs is not None:
            if count == 1:
                outputs.append(token_id)
            else:
                outputs.extend([token_id] * count)
        elif token_id == self._output_fill or not self.num_output_tokens:
            self._output_fill = token_id
        else:
            self.output_token_ids.extend([token_id] * count)  # (makes the list first)
        self.num_output_tokens += count

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + outputs; only for requests that carry real prompt tokens."""
        if self._all_token_ids is None:
            raise ValueError(f"request {self.req_id!r} carries no prompt token ids")
        return self._all_token_ids

    @property
    def has_token_ids(self) -> bool:
        return self._all_token_ids is not None

    def append_output_token_id(self, token_id: int) -> None:
        """Append one sampled token and hash any block it completes."""
        self._append_outputs(token_id, 1)
        if self._all_token_ids is not None:
            self._all_token_ids.append(token_id)
        self.num_tokens += 1
        self.hash_full_blocks()

    def append_output_tokens(self, token_id: int, count: int) -> None:
        """Append ``count`` copies of one token (a bulk run's outputs: ``engine/core/bulk``)
        without stop checks, and hash the blocks they complete."""
        self._append_outputs(token_id, count)
        if self._all_token_ids is not None:
            self._all_token_ids.extend([token_id] * count)
        self.num_tokens += count
        self.hash_full_blocks()

    def append_sampled_token(self, token_id: int, max_model_len: int) -> bool:
        """Append one sampled token, then apply vLLM 0.33.0's ``check_stop`` to it.

        Returns True (and sets the finished status) if the token ends the request. The checks
        run in 0.33.0's order: EOS → stop token (``stop_reason`` = the token) → length
        (``num_tokens >= max_model_len`` or ``max_tokens`` outputs); ``min_tokens`` only guards
        later checks (repetition detection, not implemented). EOS and stop tokens are thus
        honoured even below ``min_tokens``: a real sampler masks them until then (ours does), so
        this order matters only for scripted outputs such as the golden replays.
        """
        self._append_outputs(token_id, 1)
        all_ids = self._all_token_ids
        if all_ids is not None:
            all_ids.append(token_id)
        num_tokens = self.num_tokens = self.num_tokens + 1
        self.hash_full_blocks()
        if token_id == self.eos_token_id:
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if token_id in self.stop_token_ids:
            self.status = RequestStatus.FINISHED_STOPPED
            self.stop_reason = token_id
            return True
        if num_tokens >= max_model_len or self.num_output_tokens >= self.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    def hash_full_blocks(self) -> None:
        """Extend ``block_hashes`` to every full block of the known tokens (if a block became
        full since the last call): the hasher returns the new hashes, the request keeps them."""
        hasher = self.block_hasher
        hashes = self.block_hashes
        # Compiled, the simulator's hasher is tested and called natively on every token; the
        # real one is called natively once a block is full.
        if isinstance(hasher, PrecomputedBlockHasher):
            if self.num_tokens >= (len(hashes) + 1) * hasher.block_size:
                hashes.extend(hasher.keys(len(hashes), self.num_tokens, self.num_prompt_tokens))
        elif hasher is not None and self.num_tokens >= (len(hashes) + 1) * hasher.block_size:
            if isinstance(hasher, TokenBlockHasher):
                hashes.extend(hasher.hashes_after(hashes, self.all_token_ids, self.num_tokens))
            else:
                hashes.extend(hasher.hash_new_blocks(self))

    # -- status ---------------------------------------------------------------------------------
    def is_finished(self) -> bool:
        return self.status > RequestStatus.PREEMPTED

    def get_finished_reason(self) -> FinishReason | None:
        return FINISH_REASON_OF_STATUS.get(self.status)

    def sort_key(self) -> tuple[int, float, str]:
        """Priority-queue order: smaller priority, then earlier arrival, then request id."""
        return (self.priority, self.arrival_time, self.req_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens},"
            f" out={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
