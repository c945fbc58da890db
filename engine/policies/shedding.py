"""Load shedding: reject a request whose predicted time to first token exceeds its SLO.

FCFS (vLLM's policy) in every decision but one: when the head of the waiting queue is about
to be admitted, its TTFT is predicted as the time it has waited plus the steps its prompt
still needs at the current pace — ``ceil(prompt tokens left / tokens per step)`` steps of the
engine's recent step time, where a step gives it the budget the running requests' decodes
leave (at least one token), capped by the prefill chunk limit. If that exceeds ``slack`` × its
class's TTFT target, it is rejected at once (its reason names both figures) instead of being
served late; the requests behind it then move up. Requests that already have output tokens
(resumed after a preemption) and requests without a TTFT target are never shed.

Source: early rejection on predicted load in Mooncake (Qin et al., "Mooncake: A
KVCache-centric Disaggregated Architecture for LLM Serving", FAST 2025, arXiv:2407.00079),
whose scheduler rejects requests it predicts would miss their SLOs.

Needs SLO classes. Bulk fast path: admissions are this policy's, so no bulk run plans one
(runs while admissions are blocked, or nobody waits, are exact).
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
    PolicyError,
    read_options,
    reject,
)
from engine.core.queues import FCFSRequestQueue, RequestQueue
from engine.core.request import Request


class LoadShedding:
    """FCFS that rejects the head when its predicted TTFT exceeds ``slack`` × its SLO."""

    needs_slos = True
    bulk_properties = frozenset({BulkProperty.RUNNING_ORDER, BulkProperty.CHUNKING})

    def __init__(self, context: PolicyContext) -> None:
        options = read_options(context, {"slack": 1.0})
        self.name = context.scheduler.policy
        self.slack = float(options["slack"])
        if not self.slack > 0:
            raise PolicyError(f"slack must be > 0, got {self.slack}")
        self._threshold = context.scheduler.long_prefill_token_threshold
        self._token_budget = context.scheduler.token_budget

    def predicted_ttft_s(self, request: Request, view: AdmissionView) -> float:
        """Waited so far + the steps its prompt still needs at the recent step time."""
        left = max(request.num_tokens - request.num_computed_tokens, 1)
        per_step = max(self._token_budget - view.num_running, 1)
        limit = effective_long_prefill_threshold(self._threshold, view.num_running + 1)
        if limit > 0:
            per_step = min(per_step, limit)
        steps = math.ceil(left / per_step)
        return (view.now_s - request.arrival_time) + steps * view.step_time_s

    def new_waiting_queue(self) -> RequestQueue:
        return FCFSRequestQueue()

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        slo = request.slo
        if slo is None or math.isinf(slo.ttft_s) or request.num_output_tokens:
            return ADMIT
        predicted = self.predicted_ttft_s(request, view)
        target = self.slack * slo.ttft_s
        if predicted <= target:
            return ADMIT
        return reject(
            f"shed: predicted TTFT {predicted * 1000:.0f} ms > {target * 1000:.0f} ms "
            f"(SLO class {slo.name})"
        )

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return effective_long_prefill_threshold(self._threshold, num_unfinished_requests)
