"""Decode-first and prefill-first batching with a fixed prefill chunk (Sarathi-style).

Both cut every prefill into chunks of at most ``chunk`` tokens (option, default 512), whatever
the number of requests (vLLM applies its long-prefill threshold only while more than one
request is unfinished), and differ in who gets the step's token budget first:

* ``decode-first`` — running requests that decode before those still prefilling (each group in
  admission order), then new admissions: Sarathi-Serve's stall-free batching, where a decode
  never waits behind a prefill and prefills fill the budget the decodes leave.
* ``prefill-first`` — running requests still prefilling before those that decode: prefill
  chunks take the budget first, so decodes stall while prefills are pending (the
  prefill-prioritising schedulers Sarathi-Serve compares against, e.g. Orca and vLLM's V0
  scheduler), bounded here by the chunk size.

Source: Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
Sarathi-Serve" (OSDI 2024, arXiv:2403.02310).

Bulk fast path: decode-first keeps vLLM's running order in every bulk state (decoders first,
the one prefiller last) and its admission; its chunking differs, so bulk runs only cover steps
without a prefill. Prefill-first moves the prefiller first: no bulk runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.policy import (
    ADMIT,
    Admission,
    AdmissionView,
    BulkProperty,
    PolicyContext,
    PolicyError,
    read_options,
)
from engine.core.queues import FCFSRequestQueue, RequestQueue
from engine.core.request import Request


def is_prefilling(request: Request) -> bool:
    """Does the request need more than one token this step (a prompt, or a recomputation
    after preemption)?"""
    return request.num_tokens + request.num_output_placeholders - request.num_computed_tokens > 1


class DecodeFirst:
    """Decodes get budget before prefills; prefills in fixed chunks."""

    needs_slos = False
    bulk_properties = frozenset({BulkProperty.RUNNING_ORDER, BulkProperty.ADMISSION})
    prefills_first = False

    def __init__(self, context: PolicyContext) -> None:
        options = read_options(context, {"chunk": 512})
        self.name = context.scheduler.policy
        self.chunk = int(options["chunk"])
        if self.chunk < 1:
            raise PolicyError(f"chunk must be >= 1 token, got {self.chunk}")

    def new_waiting_queue(self) -> RequestQueue:
        return FCFSRequestQueue()

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        first = [r for r in running if is_prefilling(r) == self.prefills_first]
        if not first or len(first) == len(running):
            return None
        rest = [r for r in running if is_prefilling(r) != self.prefills_first]
        order = first + rest
        return None if all(a is b for a, b in zip(order, running, strict=True)) else order

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return self.chunk


class PrefillFirst(DecodeFirst):
    """Prefills get budget before decodes; prefills in fixed chunks."""

    bulk_properties = frozenset({BulkProperty.ADMISSION})
    prefills_first = True
