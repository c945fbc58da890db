"""The scheduling-policy seam: the five decisions a policy owns, and vLLM's policy, the default.

``Scheduler`` (``scheduler.py``) makes every decision of vLLM V1's scheduler. Five of them are a
policy's, behind the small ``SchedulingPolicy`` protocol:

1. **waiting order** — the queue admissions are taken from (``new_waiting_queue``);
2. **running order** — the order in which RUNNING requests get the step's budget
   (``order_running``; the scheduler keeps its running list in that order);
3. **victim** — which RUNNING request to preempt when KV blocks run out (``pick_victim``);
4. **admit now** — whether the head of the waiting queue is admitted now, waits (admissions
   stop for this step), or is rejected: shed, finished unserved with a reason (``admit``);
5. **prefill chunking** — the most tokens one prefill computes in a step (``prefill_chunk_limit``,
   the long-prefill threshold in force; ``chunking.py`` applies it).

Everything else — budgets, ``max_num_seqs``, KV allocation, the mechanics of preemption, async
placeholders — stays the scheduler's, so no policy can break the KV invariants or overrun a
budget. ``VllmPolicy`` is vLLM's own (FCFS or PRIORITY): the scheduler runs it on its inline,
compiled code and never calls it; every other policy is called through the protocol. A policy is
a plain class built from a ``PolicyContext``: ``build_policy`` resolves a name (``SHIPPED``) or a
``package.module:ClassName`` path and checks the class satisfies the protocol.

**The bulk fast path** (``bulk/``) predicts many steps at once and relies on properties of
vLLM's decisions; a policy declares which it keeps (``bulk_properties``) and the bulk path runs
only in the states where the missing ones cannot matter (``BulkProperty``). Never a silent
difference: a policy that declares nothing gets no bulk runs.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.core.chunking import effective_long_prefill_threshold
from engine.core.config import SchedulerConfig
from engine.core.errors import UserError
from engine.core.policy_names import SHIPPED, check_policy_name
from engine.core.queues import RequestQueue, create_request_queue
from engine.core.request import Request

if TYPE_CHECKING:
    import numpy as np  # (not imported at run time: the core's imports stay light)

#: A policy option's value (``--policy-option KEY=VALUE``, ``[engine.policy_options]``).
Scalar = str | int | float | bool


class PolicyError(UserError):
    """A policy name, class or option is unusable; the message says what is valid."""


class Verdict(enum.Enum):
    """What ``admit`` decides for the head of the waiting queue."""

    ADMIT = "admit"  # admit it now if its KV blocks fit (vLLM's rule)
    WAIT = "wait"  # admit nobody more this step (the step's blocker is POLICY)
    REJECT = "reject"  # shed it: it finishes unserved, its reason recorded


@dataclass(frozen=True, slots=True)
class Admission:
    """``admit``'s answer: a verdict, and for a rejection the reason the reports show."""

    verdict: Verdict
    reason: str = ""


ADMIT = Admission(Verdict.ADMIT)
WAIT = Admission(Verdict.WAIT)


def reject(reason: str) -> Admission:
    """Shed the request, with ``reason`` (recorded as its rejection reason)."""
    return Admission(Verdict.REJECT, reason)


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """What ``admit`` sees of the step besides the request (the core's clock is ``now_s``)."""

    now_s: float  # the engine's time at this schedule() (0 in clock-free drivers)
    step_time_s: float  # recent seconds per engine step while busy (0: not measured yet)
    token_budget: int  # tokens left in this step's budget
    num_running: int  # requests RUNNING now (admitted ones included)
    num_waiting: int  # requests waiting, the head included
    num_free_blocks: int  # free KV blocks


class BulkProperty(enum.StrEnum):
    """A property of vLLM's decisions the bulk fast path relies on (``bulk/__init__.py``).

    A bulk state is one where every running request decodes except possibly the last, which may
    be prefilling; bulk runs never preempt (they stop before KV might run out) and never reach
    an iteration that would try to admit, except the first, whose admission they plan. So the
    victim choice never matters to them, and each property below only in some states:
    """

    RUNNING_ORDER = "running_order"  # in a bulk state the running order stays as it is
    ADMISSION = "admission"  # the head is admitted whenever it fits (never WAIT or REJECT)
    CHUNKING = "chunking"  # the chunk limit is vLLM's long-prefill threshold rule


ALL_BULK_PROPERTIES: frozenset[BulkProperty] = frozenset(BulkProperty)


@dataclass(frozen=True, slots=True)
class RequestLengths:
    """The (prompt, output) token lengths of a known request stream, to fit predictors on."""

    prompt_lens: Sequence[int] | np.ndarray
    output_lens: Sequence[int] | np.ndarray


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What a world knows in advance of the requests its engine will see."""

    seed: int = 0  # the run's seed (for policies that draw, e.g. a noisy predictor)
    lengths: RequestLengths | None = None  # the workload's lengths (None: a served stream)
    has_slos: bool | None = None  # does every request carry an SLO class? (None: unknown)


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy is built from: the scheduler's config (its budgets, the policy's name and
    options) and what the world knows of the request stream."""

    scheduler: SchedulerConfig
    stream: StreamInfo = StreamInfo()

    @property
    def seed(self) -> int:
        return self.stream.seed

    @property
    def lengths(self) -> RequestLengths | None:
        return self.stream.lengths

    @property
    def has_slos(self) -> bool | None:
        return self.stream.has_slos

    @property
    def policy_options(self) -> dict[str, Scalar]:
        """The policy's options (``SchedulerConfig.policy_options``) as a dict."""
        return dict(self.scheduler.policy_options)


@runtime_checkable
class SchedulingPolicy(Protocol):
    """The decisions a scheduling policy owns (see the module docstring).

    Each method is called by ``Scheduler.schedule()`` with the scheduler's state as it is at
    that point; a policy reads requests and never changes them. ``order_running`` returns a
    permutation of ``running`` (or None: keep it), ``pick_victim`` one of ``running``; the
    queue from ``new_waiting_queue`` must pop what it last peeked.
    """

    @property
    def name(self) -> str: ...  # how runs and reports name it

    @property
    def needs_slos(self) -> bool: ...  # refuse workloads whose requests carry no SLO class

    @property
    def bulk_properties(self) -> frozenset[BulkProperty]: ...  # which vLLM properties it keeps

    def new_waiting_queue(self) -> RequestQueue: ...

    def order_running(self, running: Sequence[Request]) -> list[Request] | None: ...

    def pick_victim(self, running: Sequence[Request]) -> Request: ...

    def admit(self, request: Request, view: AdmissionView) -> Admission: ...

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int: ...


#: The members every policy class must define (checked by ``check_policy``).
PROTOCOL_METHODS = (
    "new_waiting_queue", "order_running", "pick_victim", "admit", "prefill_chunk_limit",
)
PROTOCOL_ATTRIBUTES = ("name", "needs_slos", "bulk_properties")

#: Which decision each bulk property depends on: a subclass of ``VllmPolicy`` that overrides
#: it no longer keeps that property.
_PROPERTY_METHODS: dict[BulkProperty, str] = {
    BulkProperty.RUNNING_ORDER: "order_running",
    BulkProperty.ADMISSION: "admit",
    BulkProperty.CHUNKING: "prefill_chunk_limit",
}


class VllmPolicy:
    """vLLM V1's policy (the default): FCFS, or PRIORITY when the config names "priority".

    Waiting order: arrival (FCFS) or ``(priority, arrival_time, req_id)`` (``queues.py``);
    running order: admission order, kept; victim: the most recently admitted (FCFS) or the
    largest ``(priority, arrival_time)``; admit: whenever the KV blocks fit; chunking: the
    long-prefill threshold, in force while more than one request is unfinished. Source: vLLM
    0.33.0 ``vllm/v1/core/sched/scheduler.py`` (SCHEDULER_SPEC.md §2).

    The scheduler inlines these decisions for this exact class; a subclass is called through
    the protocol like any policy, and keeps only the bulk properties of the decisions it does
    not override.
    """

    needs_slos = False

    def __init__(self, context: PolicyContext) -> None:
        sc = context.scheduler
        read_options(context, {})  # it takes none
        self.name = sc.policy
        self.priority = sc.policy == "priority"
        self.long_prefill_token_threshold = sc.long_prefill_token_threshold

    @property
    def bulk_properties(self) -> frozenset[BulkProperty]:
        cls = type(self)
        return frozenset(
            p for p, method in _PROPERTY_METHODS.items()
            if getattr(cls, method) is getattr(VllmPolicy, method)
        )

    def new_waiting_queue(self) -> RequestQueue:
        return create_request_queue("priority" if self.priority else "fcfs")

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        if self.priority:
            return max(running, key=lambda r: (r.priority, r.arrival_time))
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return effective_long_prefill_threshold(
            self.long_prefill_token_threshold, num_unfinished_requests
        )


# -- options ---------------------------------------------------------------------------------------
def read_options(context: PolicyContext, defaults: Mapping[str, Scalar]) -> dict[str, Scalar]:
    """The policy's options over ``defaults``. An unknown key, or a value whose type is not
    its default's (an int is accepted for a float), is a ``PolicyError`` naming the valid ones."""
    given = context.policy_options
    name = context.scheduler.policy
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        valid = ", ".join(f"{k} (default {v!r})" for k, v in defaults.items()) or "none"
        raise PolicyError(
            f"scheduling policy {name!r} has no option(s) {', '.join(unknown)}; valid: {valid}"
        )
    out = dict(defaults)
    for key, value in given.items():
        default = defaults[key]
        ok = type(value) is type(default) or (
            isinstance(default, float) and type(value) is int
        )
        if not ok:
            raise PolicyError(
                f"scheduling policy {name!r}: option {key} must be "
                f"{type(default).__name__} (like its default {default!r}), got {value!r}"
            )
        out[key] = float(value) if isinstance(default, float) else value
    return out


# -- building a policy by name ------------------------------------------------------------------
def policy_class(name: str) -> type:
    """The class ``name`` denotes (a shipped name or ``package.module:ClassName``), imported
    and checked to define every member of ``SchedulingPolicy``."""
    why = check_policy_name(name)
    if why is not None:
        raise PolicyError(why)
    path = SHIPPED.get(name, name)
    module_name, class_name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyError(
            f"scheduling policy {name!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        found = "nothing" if cls is None else f"a {type(cls).__name__}"
        raise PolicyError(
            f"scheduling policy {name!r}: module {module_name!r} has no class {class_name!r} "
            f"(found {found})"
        )
    missing = [m for m in PROTOCOL_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise PolicyError(
            f"scheduling policy {name!r}: {path} is not a scheduling policy: it lacks "
            f"{', '.join(missing)} (see engine/core/policy.py, SchedulingPolicy)"
        )
    return cls


def build_policy(context: PolicyContext) -> SchedulingPolicy:
    """The policy ``context.scheduler.policy`` names, built from ``context`` and checked:
    the protocol's attributes have the right types, and a policy that needs SLOs gets requests
    that carry them (``context.has_slos`` False is an error; None: not known here)."""
    name = context.scheduler.policy
    cls = policy_class(name)
    try:
        policy = cls(context)
    except PolicyError:
        raise
    except UserError as exc:
        raise PolicyError(f"scheduling policy {name!r}: {exc}") from None
    except TypeError as exc:
        raise PolicyError(
            f"scheduling policy {name!r}: cannot build {cls.__qualname__}(context) ({exc}); a "
            "policy class takes one argument, a PolicyContext"
        ) from None
    problems = [a for a in PROTOCOL_ATTRIBUTES if not hasattr(policy, a)]
    if not problems:
        if not isinstance(policy.name, str) or not policy.name:
            problems.append("name (a non-empty str)")
        if not isinstance(policy.needs_slos, bool):
            problems.append("needs_slos (a bool)")
        props = policy.bulk_properties
        if not isinstance(props, frozenset) or not all(
            isinstance(p, BulkProperty) for p in props
        ):
            problems.append("bulk_properties (a frozenset of BulkProperty)")
    if problems:
        raise PolicyError(
            f"scheduling policy {name!r}: {cls.__qualname__} is not a scheduling policy: "
            f"it lacks {', '.join(problems)} (see engine/core/policy.py, SchedulingPolicy)"
        )
    assert isinstance(policy, SchedulingPolicy)
    if policy.needs_slos and context.has_slos is False:
        raise PolicyError(needs_slos_message(name))
    return policy


def needs_slos_message(name: str) -> str:
    """The error of a policy that needs SLOs on a workload whose requests carry none."""
    return (
        f"scheduling policy {name!r} needs per-request SLOs, and the workload's requests carry "
        "no SLO class: define workload.slo_classes ([[name, ttft_ms, tpot_ms], ...]; one "
        "class applies to every request) and, for several, slo_class_mix or an slo_class "
        "column in the trace"
    )


def describe_bulk(policy: SchedulingPolicy) -> str:
    """How the bulk fast path works with ``policy``, in words for the run metadata."""
    missing = sorted(ALL_BULK_PROPERTIES - policy.bulk_properties)
    if not missing:
        return "on"
    if BulkProperty.RUNNING_ORDER in missing:
        return (
            f"off: policy {policy.name!r} does not declare {BulkProperty.RUNNING_ORDER} "
            "(every bulk run relies on it)"
        )
    limits = []
    if BulkProperty.ADMISSION in missing or BulkProperty.CHUNKING in missing:
        limits.append("no bulk run plans an admission")
    if BulkProperty.CHUNKING in missing:
        limits.append("none includes a prefill chunk")
    return (
        f"limited: policy {policy.name!r} does not declare {', '.join(missing)}; "
        + ", and ".join(limits)
    )


def policy_summary(policy: SchedulingPolicy, scheduler: SchedulerConfig, bulk: str) -> dict[
    str, object
]:
    """How a run's metadata records its policy: name, class, options, and what the bulk fast
    path did with it (``bulk``: ``describe_bulk``'s words, or why it was off)."""
    cls = type(policy)
    return {
        "name": policy.name,
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "options": dict(scheduler.policy_options),
        "bulk_fast_path": bulk,
    }


def held_message(core: object) -> str:
    """The error of a run whose policy held requests back with nothing running after the last
    request arrived: they could never run."""
    sched = getattr(core, "scheduler", None)
    name = sched.policy.name if sched is not None else "?"
    waiting = len(sched.waiting) if sched is not None else 0
    return (
        f"scheduling policy {name!r} held {waiting} waiting request(s) back (admit said WAIT) "
        "with nothing running and no request left to arrive: they can never run"
    )
