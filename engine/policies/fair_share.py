"""Per-tenant fair share by tokens served: the Virtual Token Counter (VTC).

Each tenant has a counter of the service it received: ``input_weight`` per prompt token of each
of its requests once admitted, plus ``output_weight`` per output token. The waiting queue keeps
one FIFO per tenant and admits from the backlogged tenant with the smallest counter (ties: the
tenant seen first). When a tenant's queue goes from empty to non-empty its counter is lifted to
the smallest counter of the backlogged tenants (or, when none is backlogged, to that of the
tenant admitted last), so credit does not build up while a tenant is idle. Running order,
victims, admission and chunking are vLLM's.

Source: Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024,
arXiv:2401.00588), Algorithm 1 with their cost weights (1 per input, 2 per output token).

Counters are computed from the requests' own progress when the queue is consulted, not from
per-step updates, so they are the same whether steps ran one by one or in bulk: the bulk fast
path keeps all of vLLM's properties here. Requests without a tenant share the tenant "".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from engine.core.chunking import effective_long_prefill_threshold
from engine.core.policy import (
    ADMIT,
    ALL_BULK_PROPERTIES,
    Admission,
    AdmissionView,
    PolicyContext,
    PolicyError,
    read_options,
)
from engine.core.queues import RequestQueue
from engine.core.request import Request, RequestStatus


class TenantCounters:
    """Each tenant's virtual token counter: a lift offset plus the service its requests got."""

    def __init__(self, input_weight: float, output_weight: float) -> None:
        if input_weight < 0 or output_weight < 0 or input_weight + output_weight <= 0:
            raise PolicyError(
                f"VTC weights must be >= 0 and not both 0, got input {input_weight}, output "
                f"{output_weight}"
            )
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.offset: dict[str, float] = {}  # lifts, and the service of finished requests
        self.live: dict[str, list[Request]] = {}  # requests whose service may still grow

    def track(self, request: Request) -> None:
        tenant = request.tenant
        if tenant not in self.offset:
            self.offset[tenant] = 0.0
            self.live[tenant] = []
        self.live[tenant].append(request)

    def served(self, request: Request) -> float:
        admitted = request.status != RequestStatus.WAITING
        return (
            self.input_weight * request.num_prompt_tokens * admitted
            + self.output_weight * request.num_output_tokens
        )

    def counter(self, tenant: str) -> float:
        """The tenant's counter now (finished requests are folded into its offset)."""
        live = self.live[tenant]
        total = self.offset[tenant]
        if any(r.is_finished() for r in live):
            done = [r for r in live if r.is_finished()]
            folded = sum(self.served(r) for r in done)
            self.offset[tenant] = total = total + folded
            self.live[tenant] = live = [r for r in live if not r.is_finished()]
        return total + sum(self.served(r) for r in live)

    def lift(self, tenant: str, to: float) -> None:
        """Raise the tenant's counter to at least ``to``."""
        now = self.counter(tenant)
        if now < to:
            self.offset[tenant] += to - now


class VirtualTokenCounterQueue:
    """One FIFO per tenant; the head is the oldest request of the least-served backlogged
    tenant (``engine.core.queues.RequestQueue``)."""

    def __init__(self, counters: TenantCounters) -> None:
        self.counters = counters
        self.queues: dict[str, deque[Request]] = {}  # per tenant, in first-seen order
        self.last_admitted: str | None = None

    def _tenant_queue(self, tenant: str) -> deque[Request]:
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
        return queue

    def add_request(self, request: Request) -> None:
        tenant = request.tenant
        queue = self._tenant_queue(tenant)
        counters = self.counters
        counters.track(request)
        if not queue:  # the tenant becomes backlogged: lift its counter
            backlogged = [t for t, q in self.queues.items() if q]
            if backlogged:
                counters.lift(tenant, min(counters.counter(t) for t in backlogged))
            elif self.last_admitted is not None and self.last_admitted != tenant:
                counters.lift(tenant, counters.counter(self.last_admitted))
        queue.append(request)

    def _head_tenant(self) -> str:
        best: str | None = None
        best_counter = 0.0
        for tenant, queue in self.queues.items():
            if queue:
                c = self.counters.counter(tenant)
                if best is None or c < best_counter:
                    best, best_counter = tenant, c
        if best is None:
            raise IndexError("peek from an empty queue")
        return best

    def peek_request(self) -> Request:
        return self.queues[self._head_tenant()][0]

    def pop_request(self) -> Request:
        tenant = self._head_tenant()
        self.last_admitted = tenant
        return self.queues[tenant].popleft()

    def prepend_request(self, request: Request) -> None:
        """A preempted request resumes first within its tenant (it is tracked already)."""
        self._tenant_queue(request.tenant).appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.prepend_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        for tenant, queue in self.queues.items():
            if any(id(r) in drop for r in queue):
                self.queues[tenant] = deque(r for r in queue if id(r) not in drop)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def __bool__(self) -> bool:
        return any(self.queues.values())

    def __iter__(self) -> Iterator[Request]:
        return iter([r for q in self.queues.values() for r in q])


class VirtualTokenCounter:
    """Admit from the tenant that has been served the fewest weighted tokens."""

    needs_slos = False
    bulk_properties = ALL_BULK_PROPERTIES

    def __init__(self, context: PolicyContext) -> None:
        options = read_options(context, {"input_weight": 1.0, "output_weight": 2.0})
        self.name = context.scheduler.policy
        self.counters = TenantCounters(
            float(options["input_weight"]), float(options["output_weight"])
        )
        self._threshold = context.scheduler.long_prefill_token_threshold

    def new_waiting_queue(self) -> RequestQueue:
        return VirtualTokenCounterQueue(self.counters)

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return effective_long_prefill_threshold(self._threshold, num_unfinished_requests)
