"""The simulator's routers: the shared ones of ``engine/core/routing.py`` plus those that look
at no replica, split by whether a run with them can be sharded.

Three routers choose without looking at any replica (``INDEPENDENT_ROUTERS``: a run with one of
them can be split over processes, ``sim/fleet.py``); each picks for request number ``seq`` from
that alone and from the order in which it is asked:

* ``round_robin`` — replicas in turn, in routing order (the server's ``RoundRobinRouter`` does
  the same with ``choose``);
* ``random`` — a uniformly random replica per request, drawn from the workload's seed (one
  draw per request, by its place in the stream, so the choice does not depend on the order in
  which requests are routed);
* ``consistent_hash`` — consistent hashing of the request's routing key (``routing_keys``: its
  shared prefix, or its Mooncake conversation, else the request itself) onto a
  ring of ``RING_POINTS`` points per replica, so requests of one prefix or session go to one
  replica (and the others keep theirs when a replica is added).

The rest read the replicas' state (``STATE_ROUTERS``: ``least_outstanding``, ``least_kv``,
``prefix_aware``, ``vllm``, as ``engine/core/routing.py`` defines them for both worlds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final, Protocol

import numpy as np

from engine.core.routing import ROUTERS as SHARED_ROUTERS
from engine.core.routing import (
    LeastKVRouter,
    LeastOutstandingRouter,
    PrefixAwareRouter,
    ReplicaView,
    Router,
    UnknownRouterError,
    VLLMRouter,
)
from workload.stream import Workload

__all__ = [  # the shared routers, re-exported beside the simulator's own
    "LeastKVRouter", "LeastOutstandingRouter", "PrefixAwareRouter", "ReplicaView", "Router",
    "UnknownRouterError", "VLLMRouter",
]


class IndependentRouter(Protocol):
    """A router that looks at no replica: it picks one for request number ``seq`` (its place
    in the workload) from that alone and from the order in which it is asked."""

    def pick(self, seq: int) -> int: ...


class RoundRobinRouter:
    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self._next = 0

    def pick(self, seq: int) -> int:
        i = self._next
        self._next = (i + 1) % self.num_replicas
        return i


class PresetRouter:
    """Each request goes where a table says (``choices[seq]``): ``random`` and
    ``consistent_hash`` compute their table up front."""

    def __init__(self, choices: np.ndarray) -> None:
        self.choices = choices.astype(np.int64)

    def pick(self, seq: int) -> int:
        return int(self.choices[seq])


#: Points per replica on the consistent-hashing ring (more: a more even share per replica).
RING_POINTS: Final = 160

def _mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64s: a fixed, well-spread hash (same on every machine)."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def routing_keys(workload: Workload) -> np.ndarray:
    """Per request (send order), the key ``consistent_hash`` routes by, as a uint64: the shared
    prefix's id (``prefix_repetition``); for Mooncake requests, the id of their first block
    past the blocks every request starts with (a system prompt): their conversation; else the
    request's own index. The three kinds live in separate key spaces, so equal keys mean the
    same prefix, conversation or request."""
    n = len(workload)
    kind = np.full(n, 2, dtype=np.uint64)
    value = np.arange(n, dtype=np.uint64)
    prefix = workload.shared_prefix_ids >= 0
    kind[prefix] = 0
    value[prefix] = workload.shared_prefix_ids[prefix].astype(np.uint64)
    if workload.hash_ids is not None and n:
        common = _common_prefix_len(workload.hash_ids)
        first = np.fromiter((ids[common] if len(ids) > common else -1
                             for ids in workload.hash_ids), dtype=np.int64, count=n)
        block = first >= 0
        kind[block] = 1
        value[block] = first[block].astype(np.uint64)
    keys: np.ndarray = value * np.uint64(3) + kind
    return keys


def _common_prefix_len(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading items every sequence shares."""
    shortest = min(sequences, key=len)
    for k, item in enumerate(shortest):
        if any(seq[k] != item for seq in sequences):
            return k
    return len(shortest)


def consistent_hash_choices(keys: np.ndarray, num_replicas: int) -> np.ndarray:
    """The replica of each key on a ring of ``RING_POINTS`` points per replica: the first
    point at or after the key's (hashed) position, clockwise."""
    replica = np.repeat(np.arange(num_replicas, dtype=np.int64), RING_POINTS)
    point = np.tile(np.arange(RING_POINTS, dtype=np.uint64), num_replicas)
    positions = _mix64(_mix64(replica.astype(np.uint64)) ^ point)
    order = np.argsort(positions, kind="stable")
    positions, owners = positions[order], replica[order]
    slot = np.searchsorted(positions, _mix64(keys), side="left") % len(positions)
    out: np.ndarray = owners[slot]
    return out


def random_choices(seed: int, num_requests: int, num_replicas: int) -> np.ndarray:
    """One uniformly random replica per request, from ``seed``."""
    rng = np.random.default_rng([seed, 0x524F555445])  # a stream of its own ("ROUTE")
    out: np.ndarray = rng.integers(0, num_replicas, size=num_requests, dtype=np.int64)
    return out


@dataclass(frozen=True, slots=True)
class RouterInputs:
    """What a router may be built from: the replica count, the stream, the knobs."""

    num_replicas: int
    workload: Workload
    seed: int = 0  # ``random``'s draws
    load_cap: int = 8  # ``prefix_aware``'s


#: Routers whose choice depends on no replica's state (a run with one can be sharded).
INDEPENDENT_ROUTERS: dict[str, Callable[[RouterInputs], IndependentRouter]] = {
    "round_robin": lambda x: RoundRobinRouter(x.num_replicas),
    "random": lambda x: PresetRouter(random_choices(x.seed, len(x.workload), x.num_replicas)),
    "consistent_hash": lambda x: PresetRouter(
        consistent_hash_choices(routing_keys(x.workload), x.num_replicas)
    ),
}

def _shared_router(factory: Callable[[int], Router], inputs: RouterInputs) -> Router:
    return factory(inputs.load_cap)


#: Routers that read the replicas' state: the shared ones (``engine.core.routing.ROUTERS``, in
#: their order) but round robin, which the simulator runs as an ``IndependentRouter``.
STATE_ROUTERS: dict[str, Callable[[RouterInputs], Router]] = {
    name: partial(_shared_router, factory)
    for name, factory in SHARED_ROUTERS.items() if name not in INDEPENDENT_ROUTERS
}

#: Every router's name.
ROUTERS: tuple[str, ...] = (*INDEPENDENT_ROUTERS, *STATE_ROUTERS)


def check_router(name: str) -> None:
    if name not in ROUTERS:
        raise UnknownRouterError(f"unknown router {name!r}; valid: {', '.join(ROUTERS)}")


def make_router(name: str, inputs: RouterInputs) -> Router | IndependentRouter:
    """The router ``name`` (an ``IndependentRouter`` exactly when it is one of
    ``INDEPENDENT_ROUTERS``)."""
    check_router(name)
    if name in INDEPENDENT_ROUTERS:
        return INDEPENDENT_ROUTERS[name](inputs)
    return STATE_ROUTERS[name](inputs)
