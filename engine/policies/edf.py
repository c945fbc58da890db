"""Earliest deadline first on per-request TTFT and TPOT SLOs.

Every request of an SLO class has a deadline for each of its tokens: the first at
``arrival + ttft``, token ``k + 1`` at ``arrival + ttft + k · tpot`` (the pace the class's TPOT
allows). EDF serves the earliest next-token deadline first: the waiting queue in that order,
the running requests get the step's budget in that order, and on a KV shortage the request
with the latest deadline (the most slack) is preempted (ties: the latest admitted). A request
without targets has no deadline (served after all that have one).

Source: Liu and Layland, "Scheduling Algorithms for Multiprogramming in a Hard-Real-Time
Environment", JACM 20(1), 1973; per-token deadlines from TTFT/TPOT as in LLM serving systems
that schedule for SLOs (e.g. Andes, Liu et al., arXiv:2404.16283).

Needs SLO classes (``needs_slos``). Bulk fast path: the running order changes with the
deadlines, so none (``RUNNING_ORDER`` not declared); admission and chunking are vLLM's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.core.chunking import effective_long_prefill_threshold
from engine.core.policy import (
    ADMIT,
    Admission,
    AdmissionView,
    BulkProperty,
    PolicyContext,
    read_options,
)
from engine.core.queues import RequestQueue
from engine.core.request import Request
from engine.policies.keyed_queue import KeyedRequestQueue


def next_token_deadline(request: Request) -> float:
    """When the request's next output token is due (inf: no targets)."""
    slo = request.slo
    if slo is None or math.isinf(slo.ttft_s):
        return math.inf
    k = request.num_output_tokens
    if k == 0:
        return request.arrival_time + slo.ttft_s
    if math.isinf(slo.tpot_s):
        return math.inf
    return request.arrival_time + slo.ttft_s + k * slo.tpot_s


class EarliestDeadlineFirst:
    """Serve the earliest next-token deadline first."""

    needs_slos = True
    bulk_properties = frozenset({BulkProperty.ADMISSION, BulkProperty.CHUNKING})

    def __init__(self, context: PolicyContext) -> None:
        read_options(context, {})
        self.name = context.scheduler.policy
        self._threshold = context.scheduler.long_prefill_token_threshold

    def new_waiting_queue(self) -> RequestQueue:
        return KeyedRequestQueue(lambda r: (next_token_deadline(r),))

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        order = sorted(running, key=next_token_deadline)  # stable: ties keep admission order
        return None if all(a is b for a, b in zip(order, running, strict=True)) else order

    def pick_victim(self, running: Sequence[Request]) -> Request:
        best, latest = running[-1], next_token_deadline(running[-1])
        for request in reversed(running):  # ties: the latest admitted
            deadline = next_token_deadline(request)
            if deadline > latest:
                best, latest = request, deadline
        return best

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return effective_long_prefill_threshold(self._threshold, num_unfinished_requests)
