"""The request-path stages around the engine core: API servers and the output processor.

Both are deterministic queues whose service times are known when work arrives, so they are
computed in closed form instead of with one SimPy event per request:

* ``APIServerPool`` — ``num_api_servers`` front-end processes serving requests first come, first
  served (exactly a SimPy ``Resource(capacity=N)`` with FIFO requests): validation + chat
  template + tokenization, then IPC to the engine core.
* ``OutputStage`` — one serial stage that receives each engine step's outputs over IPC,
  detokenizes them and streams the chunks to clients (the time vLLM's output handler takes; the
  real detokenizer is ``engine.serve.output_processor.OutputProcessor``); a step's outputs
  reach their clients together when it finishes processing them.

Requests are offered to the pool in send order and step outputs to the processor in update
order, both nondecreasing in time, which is what makes the closed forms exact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from sim.config import FrontendConfig


@dataclass(frozen=True, slots=True)
class FrontendTimes:
    """When one request passed the front end (seconds)."""

    frontend_start_s: float  # an API-server process picked it up
    tokenized_s: float  # template + tokenization done, sent to the engine
    engine_arrival_s: float  # reached the engine core's input queue (after IPC)

    # Written out so mypyc compiles it (see engine/core/outputs.py's docstring).
    def __init__(
        self, frontend_start_s: float, tokenized_s: float, engine_arrival_s: float
    ) -> None:
        object.__setattr__(self, "frontend_start_s", frontend_start_s)
        object.__setattr__(self, "tokenized_s", tokenized_s)
        object.__setattr__(self, "engine_arrival_s", engine_arrival_s)


class APIServerPool:
    """N identical front-end processes, FIFO."""

    def __init__(self, cfg: FrontendConfig) -> None:
        self.cfg = cfg
        self._free_at = [0.0] * cfg.num_api_servers  # min-heap of process free times
        self.busy_s = 0.0  # total CPU time spent (for utilisation)

    def admit(
        self, arrival_s: float, num_prompt_tokens: int, cost_s: float | None = None
    ) -> FrontendTimes:
        """One request through the first free process; ``cost_s`` replaces the configured
        front-end cost (a replay of a measured request's own)."""
        cfg = self.cfg
        free = heapq.heappop(self._free_at)
        start = arrival_s if arrival_s > free else free
        if cost_s is None:
            cost = cfg.request_overhead_s + cfg.tokenize_s_per_token * num_prompt_tokens
        else:
            cost = cost_s
        done = start + cost
        heapq.heappush(self._free_at, done)
        self.busy_s += cost
        return FrontendTimes(start, done, done + cfg.ipc_latency_s)


class OutputStage:
    """Serial detokenize-and-stream stage for engine step outputs."""

    def __init__(self, cfg: FrontendConfig) -> None:
        self.cfg = cfg
        self._free_at = 0.0
        self.busy_s = 0.0

    def process(self, update_time_s: float, num_tokens: int, num_first: int = 0) -> float:
        """Outputs of a step applied at ``update_time_s`` (``num_first`` of them requests'
        first outputs): when they reach the client."""
        cfg = self.cfg
        ready = update_time_s + cfg.ipc_latency_s
        start = ready if ready > self._free_at else self._free_at
        cost = (
            cfg.output_batch_overhead_s
            + cfg.detokenize_s_per_token * num_tokens
            + cfg.first_output_overhead_s * num_first
        )
        self._free_at = start + cost
        self.busy_s += cost
        return self._free_at + cfg.network_latency_s

    def plan(
        self, update_times_s: list[float], num_tokens: list[int], num_first: list[int]
    ) -> list[float]:
        """Delivery times of the steps with outputs among consecutive steps (outputs of
        ``num_tokens[j]`` tokens, ``num_first[j]`` of them first outputs, applied at
        ``update_times_s[j]``), without changing state (``deliver_steps`` makes them happen)."""
        return self._walk(0, update_times_s, num_tokens, num_first)[1]

    def deliver_steps(
        self,
        first_step_id: int,
        update_times_s: list[float],
        num_tokens: list[int],
        num_first: list[int],
    ) -> tuple[list[int], list[float]]:
        """``process`` for consecutive steps ``first_step_id, first_step_id + 1, …`` (outputs
        of ``num_tokens[j]`` tokens, ``num_first[j]`` of them first outputs, applied at
        ``update_times_s[j]``; steps without outputs send nothing): the ids of the steps that
        delivered and their delivery times."""
        step_ids, delivered, self._free_at, self.busy_s = self._walk(
            first_step_id, update_times_s, num_tokens, num_first
        )
        return step_ids, delivered

    def _walk(
        self,
        first_step_id: int,
        update_times_s: list[float],
        num_tokens: list[int],
        num_first: list[int],
    ) -> tuple[list[int], list[float], float, float]:
        """``process`` step by step from the current state, which is left unchanged: the steps
        that delivered, their delivery times, and the state after them (free at, busy)."""
        cfg = self.cfg
        ipc, net = cfg.ipc_latency_s, cfg.network_latency_s
        over, per_token = cfg.output_batch_overhead_s, cfg.detokenize_s_per_token
        per_first = cfg.first_output_overhead_s
        free = self._free_at
        busy = self.busy_s
        step_ids: list[int] = []
        delivered: list[float] = []
        for j in range(len(update_times_s)):
            n = num_tokens[j]
            if not n:
                continue
            ready = update_times_s[j] + ipc
            cost = over + per_token * n + per_first * num_first[j]
            free = (ready if ready > free else free) + cost  # as process()
            busy += cost
            step_ids.append(first_step_id + j)
            delivered.append(free + net)
        return step_ids, delivered, free, busy
