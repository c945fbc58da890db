"""Data-parallel replicas behind shared API servers, and the routers that pick one per request —
the same code in both worlds: the simulator's cluster (``sim/runtime.py``) and every API server
of ``twinserve serve -dp N`` (``engine/entrypoints/engine_client.py``).

Each replica is its own ``EngineCore`` (scheduler + KV cache) on its own GPUs. When a request
leaves an API server, the router chooses a replica from what it can know at that moment
(``ReplicaView``): requests it routed there that are not yet fully delivered, the replica's
last reported queue lengths and KV usage (the simulator: as of the last step it applied; a
server: as the DP coordinator last published them), and — for the prefix-aware router — how
many of the request's leading tokens that replica's cache holds (the simulator looks in the
replica's prefix cache; a server, which cannot, in an index of the prompt blocks it sent
there). A router never reads the request itself: it hands it to ``cached_prefix_tokens``.

Routers (a plain dict selects one by name, ``ROUTERS``):

* ``round_robin`` — replicas in turn;
* ``least_outstanding`` — fewest requests in flight (routed, not yet delivered);
* ``least_kv`` — lowest KV-cache usage, then fewest in flight;
* ``prefix_aware`` — the longest cached prefix, among replicas whose load is within
  ``load_cap`` requests of the least-loaded one (otherwise the least loaded);
* ``vllm`` — vLLM 0.33.0's internal DP load balancer (one API server): score = max(in flight,
  waiting + running) + waiting · 6 · max(0, KV usage − 0.5); the lowest score wins, the lower
  rank on ties. (vLLM also bumps its local copy of the chosen engine's waiting count between
  stats updates; here the in-flight count already includes every routed request.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.core.errors import UserError

#: What a router routes: the world's own request object, opaque to the router.
Request = Any


class UnknownRouterError(UserError):
    """An unknown router name; the message lists the valid ones."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a router knows about one replica when it routes a request."""

    index: int
    num_outstanding: int  # routed here, final chunk not yet delivered
    num_running: int  # last reported by the engine
    num_waiting: int  # last reported by the engine
    kv_usage: float  # last reported by the engine, in [0, 1]
    cached_prefix_tokens: Callable[[Request], int]  # leading tokens this replica's cache holds


class Router(Protocol):
    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int: ...


class RoundRobinRouter:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return i


class LeastOutstandingRouter:
    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda r: (r.num_outstanding, r.index)).index


class LeastKVRouter:
    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda r: (r.kv_usage, r.num_outstanding, r.index)).index


class PrefixAwareRouter:
    """Longest cached prefix wins, unless that replica is overloaded relative to the others."""

    def __init__(self, load_cap: int = 8) -> None:
        if load_cap < 0:
            raise UserError(f"router_load_cap must be >= 0, got {load_cap}")
        self.load_cap = load_cap

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        least = min(r.num_outstanding for r in replicas)
        eligible = [r for r in replicas if r.num_outstanding <= least + self.load_cap]
        hits = [(r.cached_prefix_tokens(request), r) for r in eligible]
        best = max(h for h, _ in hits)
        if best == 0:
            return min(eligible, key=lambda r: (r.num_outstanding, r.index)).index
        return min(
            (r for h, r in hits if h == best), key=lambda r: (r.num_outstanding, r.index)
        ).index


class VLLMRouter:
    """vLLM 0.33.0's DP load balancer (``DPLBAsyncMPClient.get_core_engine_for_request``)."""

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        best, best_score = 0, float("inf")
        for r in replicas:
            score = float(max(r.num_outstanding, r.num_waiting + r.num_running))
            if r.num_waiting:
                score += r.num_waiting * 6.0 * max(0.0, r.kv_usage - 0.5)
            if score < best_score:
                best, best_score = r.index, score
        return best


ROUTERS: dict[str, Callable[[int], Router]] = {
    "round_robin": lambda cap: RoundRobinRouter(),
    "least_outstanding": lambda cap: LeastOutstandingRouter(),
    "least_kv": lambda cap: LeastKVRouter(),
    "prefix_aware": PrefixAwareRouter,
    "vllm": lambda cap: VLLMRouter(),
}


def make_router(name: str, load_cap: int = 8) -> Router:
    if name not in ROUTERS:
        raise UnknownRouterError(f"unknown router {name!r}; valid: {', '.join(ROUTERS)}")
    return ROUTERS[name](load_cap)
