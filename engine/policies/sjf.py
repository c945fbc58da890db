"""Shortest job first, and shortest remaining first, by known or predicted output length.

``sjf`` admits the waiting request with the shortest predicted output first (ties in arrival
order); everything else is vLLM's. ``srpt`` orders the queue by the predicted *remaining*
output (a preempted request keeps the tokens it produced) and, when KV blocks run out,
preempts the running request with the most predicted output left (ties: the latest admitted).
Neither preempts to admit: the scheduler preempts only on KV shortage.

Sources: shortest processing time first (Smith, "Various optimizers for single-stage
production", Naval Research Logistics Quarterly 3, 1956) and shortest remaining processing time
(Schrage, "A proof of the optimality of the shortest remaining processing time discipline",
Operations Research 16(3), 1968); for LLM serving with predicted output lengths, Qiu et al.
(arXiv:2404.08509) and Fu et al., "Efficient LLM Scheduling by Learning to Rank" (NeurIPS
2024). The length comes from a predictor (``predictors.py``: oracle, bucket, noisy).

Bulk fast path: both keep vLLM's running order, admission and chunking (the queue order and
the victim never matter to it).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.chunking import effective_long_prefill_threshold
from engine.core.policy import (
    ADMIT,
    ALL_BULK_PROPERTIES,
    Admission,
    AdmissionView,
    PolicyContext,
    read_options,
)
from engine.core.queues import RequestQueue
from engine.core.request import Request
from engine.policies.keyed_queue import KeyedRequestQueue
from engine.policies.predictors import PREDICTOR_OPTIONS, make_predictor


class ShortestJobFirst:
    """Admit the shortest predicted output first."""

    needs_slos = False
    bulk_properties = ALL_BULK_PROPERTIES

    def __init__(self, context: PolicyContext) -> None:
        options = read_options(context, PREDICTOR_OPTIONS)
        self.name = context.scheduler.policy
        self.predictor = make_predictor(options, context)
        self._threshold = context.scheduler.long_prefill_token_threshold

    def predicted_left(self, request: Request) -> float:
        """Predicted output tokens still to come (at least 1)."""
        return max(self.predictor.predict(request) - request.num_output_tokens, 1.0)

    def new_waiting_queue(self) -> RequestQueue:
        return KeyedRequestQueue(lambda r: (self.predictor.predict(r),))

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return effective_long_prefill_threshold(self._threshold, num_unfinished_requests)


class ShortestRemainingFirst(ShortestJobFirst):
    """Queue by predicted remaining output; preempt the most remaining first."""

    def new_waiting_queue(self) -> RequestQueue:
        return KeyedRequestQueue(lambda r: (self.predicted_left(r),))

    def pick_victim(self, running: Sequence[Request]) -> Request:
        best, most = running[-1], self.predicted_left(running[-1])
        for request in reversed(running):  # ties: the latest admitted
            left = self.predicted_left(request)
            if left > most:
                best, most = request, left
        return best
