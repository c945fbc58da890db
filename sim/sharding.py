"""A data-parallel run planned up front: where every request goes, and which process runs what.

With an open-loop client the send times are known, and the shared API servers are a FIFO queue
whose times follow from the send times alone (``stages.APIServerPool``): every request's
front-end times can be computed before the run. With a router that reads no replica state
(``cluster.INDEPENDENT_ROUTERS``) its replica can be too: the router is asked in routing order
— requests leave the API servers at their tokenized times, ties in send order — exactly as the
router process of a run would ask it. Nothing a replica does then reaches another replica, so
the replicas can be simulated apart: each ``Shard`` holds some replicas, the requests routed to
them and those requests' front-end times (the one shard that records them also gets the
requests the front end rejects). ``sim/fleet.py`` runs shards in processes and merges them;
a single-process run with such a router is one shard holding everything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cluster import INDEPENDENT_ROUTERS, RouterInputs
from sim.config import FrontendConfig
from sim.stages import APIServerPool
from workload.stream import Workload


@dataclass(frozen=True, slots=True)
class Shard:
    """The part of a data-parallel run that one process simulates.

    ``requests`` are global request indices in send order (routed to ``replicas``, plus the
    rejected ones where ``records_rejections``); the arrays beside it are per request.
    """

    replicas: tuple[int, ...]  # global replica indices, increasing
    requests: np.ndarray  # int64
    route: np.ndarray  # int64: the request's replica (global index); -1: rejected
    frontend_start_s: np.ndarray  # float64 (NaN: rejected)
    tokenized_s: np.ndarray  # float64
    engine_arrival_s: np.ndarray  # float64
    api_server_busy_s: float  # of the whole run's API servers
    records_rejections: bool

    def __len__(self) -> int:
        return len(self.requests)


@dataclass(frozen=True, slots=True)
class FrontendPlan:
    """Every request's front-end times (send order), as an open-loop run computes them."""

    rejected: np.ndarray  # bool: refused by the front end (over max_model_len)
    frontend_start_s: np.ndarray  # float64, NaN where rejected
    tokenized_s: np.ndarray
    engine_arrival_s: np.ndarray
    api_server_busy_s: float


def plan_frontend(
    workload: Workload, frontend: FrontendConfig, max_model_len: int
) -> FrontendPlan:
    """The API servers' times of every request the front end admits, in send order (what
    ``SimRuntime`` computes request by request)."""
    n = len(workload)
    rejected = workload.prompt_lens + workload.output_lens > max_model_len
    start, tokenized, arrival = (np.full(n, np.nan) for _ in range(3))
    pool = APIServerPool(frontend)
    net = frontend.network_latency_s
    send = workload.send_time_s.tolist()
    prompts = workload.prompt_lens.tolist()
    for i in np.flatnonzero(~rejected).tolist():
        times = pool.admit(send[i] + net, prompts[i])
        start[i], tokenized[i], arrival[i] = (
            times.frontend_start_s, times.tokenized_s, times.engine_arrival_s
        )
    return FrontendPlan(rejected, start, tokenized, arrival, pool.busy_s)


def plan_routes(router: str, inputs: RouterInputs, plan: FrontendPlan) -> np.ndarray:
    """Each admitted request's replica (-1: rejected): ``router`` (one of
    ``INDEPENDENT_ROUTERS``) asked in routing order — by tokenized time, then send order."""
    picker = INDEPENDENT_ROUTERS[router](inputs)
    live = np.flatnonzero(~plan.rejected)
    order = live[np.lexsort((live, plan.tokenized_s[live]))]
    route = np.full(len(plan.rejected), -1, dtype=np.int64)
    for i in order.tolist():
        route[i] = picker.pick(i)
    return route


def replica_blocks(num_replicas: int, num_shards: int) -> list[tuple[int, ...]]:
    """Replicas ``0 … num_replicas-1`` in ``num_shards`` contiguous blocks, as even as can be
    (never more blocks than replicas)."""
    num_shards = max(1, min(num_shards, num_replicas))
    size, extra = divmod(num_replicas, num_shards)
    blocks, start = [], 0
    for k in range(num_shards):
        end = start + size + (k < extra)
        blocks.append(tuple(range(start, end)))
        start = end
    return blocks


def plan_shards(
    workload: Workload,
    frontend: FrontendConfig,
    max_model_len: int,
    router: str,
    inputs: RouterInputs,
    num_shards: int,
) -> list[Shard]:
    """The run in at most ``num_shards`` shards (one per replica at most); the first records
    the rejected requests."""
    plan = plan_frontend(workload, frontend, max_model_len)
    route = plan_routes(router, inputs, plan)
    shards = []
    for k, replicas in enumerate(replica_blocks(inputs.num_replicas, num_shards)):
        mine = (route >= replicas[0]) & (route <= replicas[-1])
        if k == 0:
            mine |= plan.rejected
        idx = np.flatnonzero(mine)
        shards.append(Shard(
            replicas=replicas,
            requests=idx.astype(np.int64),
            route=route[idx],
            frontend_start_s=plan.frontend_start_s[idx],
            tokenized_s=plan.tokenized_s[idx],
            engine_arrival_s=plan.engine_arrival_s[idx],
            api_server_busy_s=plan.api_server_busy_s,
            records_rejections=k == 0,
        ))
    return shards
