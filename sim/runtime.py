"""The simulated world: SimPy processes for the client and the engine, around the shared core.

The request path of ARCHITECTURE.md §1, with the engine core (``engine.core.EngineCore``, the
very code the golden replays check) at its centre:

* the **client** process sends requests at the workload's send times (open loop) or whenever a
  slot of ``max_concurrency`` frees (closed loop, like vllm bench's semaphore);
* the **API servers** (``stages.APIServerPool``) validate, template and tokenize each request,
  then send it over IPC to the engine's input queue;
* the **engine** process runs vLLM's busy loop: drain inputs, ``begin_step``, the cost model's
  step time on the GPU timeline, ``finish_step`` of the oldest batch — two batches in flight
  under async scheduling, so the scheduler's CPU time (a cost term) overlaps the GPU;
* each step's outputs go over IPC to the **output processor** (``stages.OutputStage``) and
  over the network to the clients.

With data parallelism, a router picks each request's replica when it leaves the API servers.
Where that choice can be made up front (an open loop, a router that reads no replica state) the
run is planned as a ``Shard`` (``sim/sharding.py``): requests go straight to their replica,
and a run split over processes simulates one shard of several each (``sim/fleet.py``).

Every stage writes the core's event records. For speed the engine runs ahead of the SimPy
clock up to the *horizon* — the earliest time anything outside the engine could change what it
sees (the next request reaching its input queue, or the client's next possible send) — and
applies runs of identical decode steps in bulk (``engine/core/bulk``), exactly.
"""

from __future__ import annotations

import gc
import heapq
import math
import sys
import threading
import time
from array import array
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from engine.core.config import EngineConfig
from engine.core.events import EventKind, EventLog
from engine.core.hashing import PrecomputedBlockHasher
from engine.core.interfaces import CostModel
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.policy import (
    PolicyError,
    RequestLengths,
    StreamInfo,
    describe_bulk,
    held_message,
    policy_summary,
)
from engine.core.request import Request, SamplingParams
from sim.clock import wake_at
from sim.cluster import (
    INDEPENDENT_ROUTERS,
    STATE_ROUTERS,
    IndependentRouter,
    ReplicaView,
    Router,
    RouterInputs,
    check_router,
)
from sim.config import SimConfig, resolve_engine_config
from sim.models import ModelSpec
from sim.replica import STEP_ID_STRIDE, EngineReplica
from sim.sharding import Shard, plan_shards
from sim.stages import APIServerPool, FrontendTimes
from workload.admission import exceeds_max_model_len, reject_reason
from workload.build import build_workload
from workload.stream import Workload

#: Youngest-generation GC threshold during a run (CPython's default is 700).
GC_GEN0_THRESHOLD = 20_000

# The loop makes millions of short-lived objects. With CPython's default thresholds the cyclic
# GC would run often and, in its full passes, walk every long-lived object made before the loop
# (configs, imported modules, a caller's own data): runs freeze those and let the youngest
# generation grow larger, then restore both. ``run_simulation`` enters before it builds the
# runtime, so the runtime's own objects (≈ 10,000 tracked ones whatever the run's length: the
# workload is columns) stay young, and the collection of the finished runtime walks them only.
# A caller's own GC settings win: nothing is frozen (or unfrozen) if the caller already froze
# objects, and thresholds stay as they are if automatic collection is off (threshold 0).
# Counted, so runs in concurrent threads (and ``run()`` inside ``run_simulation``) restore only
# when the last one ends.
_gc_lock = threading.Lock()
_gc_runs = 0
_gc_saved_thresholds: tuple[int, int, int] = (700, 10, 10)
_gc_froze = False


def _loop_gc_enter() -> None:
    global _gc_runs, _gc_saved_thresholds, _gc_froze
    with _gc_lock:
        if _gc_runs == 0:
            _gc_saved_thresholds = gc.get_threshold()
            _gc_froze = gc.get_freeze_count() == 0
            if _gc_froze:
                gc.freeze()
            first, *rest = _gc_saved_thresholds
            if first > 0:
                gc.set_threshold(max(first, GC_GEN0_THRESHOLD), *rest)
        _gc_runs += 1


def _loop_gc_exit() -> None:
    global _gc_runs
    with _gc_lock:
        _gc_runs -= 1
        if _gc_runs == 0:
            gc.set_threshold(*_gc_saved_thresholds)
            if _gc_froze:
                gc.unfreeze()


@dataclass(slots=True)
class SimStats:
    """Counters of one run (for reports and benchmarks)."""

    num_requests: int = 0
    num_rejected: int = 0  # by the admission rule, or shed by the scheduling policy
    num_steps: int = 0  # engine steps (schedule() calls applied)
    num_bulk_steps: int = 0  # of which applied by the bulk fast path
    num_bulk_runs: int = 0
    wall_time_s: float = 0.0
    simulated_time_s: float = 0.0
    api_server_busy_s: float = 0.0
    output_processor_busy_s: float = 0.0


@dataclass(slots=True)
class SimResult:
    """Everything a report needs about one simulated run."""

    config: SimConfig
    engine_config: EngineConfig
    workload: Workload
    event_log: EventLog
    stats: SimStats
    reject_reasons: dict[str, str] = field(default_factory=dict)
    scheduling_policy: dict[str, object] = field(default_factory=dict)  # policy_summary
    # modules that ran compiled where the run was simulated; None: in this process (a sharded
    # run: the fewest of any worker, which may be another machine)
    compiled_modules: int | None = None


def make_cost_model(cfg: SimConfig, engine_config: EngineConfig | None = None) -> CostModel:
    """The cost model ``cfg.cost_model`` names ("auto": ``cfg.resolved_cost_model``); the vLLM
    step model sizes its CUDA graphs from the engine's scheduler budgets. With pipeline stages
    it prices each stage (``sim.cost.pipeline``) and the sends between them."""
    if cfg.pipeline_parallel_size > 1:
        from sim.cost.pipeline import PipelineCostModel
        from sim.network import get_network, stage_links

        links = stage_links(cfg.gpu_spec, get_network(cfg.network), cfg.tensor_parallel_size,
                            cfg.pipeline_parallel_size, cfg.gpus_per_node)
        return PipelineCostModel(
            cfg.model_spec, cfg.pipeline_parallel_size, cfg.tensor_parallel_size,
            lambda stage: _stage_cost_model(cfg, stage, engine_config), links,
        )
    return _stage_cost_model(cfg, cfg.model_spec, engine_config)


def _stage_cost_model(
    cfg: SimConfig, model_spec: ModelSpec, engine_config: EngineConfig | None
) -> CostModel:
    """The cost model for ``model_spec`` (the whole model, or one stage's layers of it)."""
    name = cfg.resolved_cost_model
    if name == "roofline":
        from sim.cost.roofline import RooflineCostModel

        return RooflineCostModel(
            model_spec, cfg.gpu_spec, cfg.tensor_parallel_size, cfg.roofline,
            expert_parallel=cfg.enable_expert_parallel,
            data_parallel_size=cfg.data_parallel_size,
        )
    if name == "vllm":
        from sim.cost.cuda_graphs import CudaGraphPlan
        from sim.cost.vllm_step import VllmStepCostModel

        sched = (engine_config or resolve_engine_config(cfg)).scheduler
        gpu = cfg.gpu_spec
        graphs = CudaGraphPlan.for_engine(
            cfg.cuda_graphs, sched.max_num_seqs, sched.max_num_batched_tokens, gpu.sm_version,
        )
        return VllmStepCostModel(
            model_spec, gpu, cfg.tensor_parallel_size,
            weight_dtype=cfg.weight_dtype,
            kv_cache_dtype="fp8" if cfg.fp8_kv_cache else "bfloat16",
            graphs=graphs, host=cfg.host_costs,
            data_parallel_size=cfg.data_parallel_size,
            expert_parallel=cfg.enable_expert_parallel,
            all2all_backend=cfg.all2all_backend,
        )
    from sim.cost.fitted import FittedCostModel

    model: CostModel = FittedCostModel.load(name.split(":", 1)[1])
    return model


class SimRuntime:
    """One simulated run of ``cfg`` (a pure function of it: same config, same event log)."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        workload: Workload | None = None,
        cost_model: CostModel | None = None,
        progress: Callable[[int, int, float], None] | None = None,
        shard: Shard | None = None,
        request_frontend_s: Sequence[float] | None = None,
    ) -> None:
        """``request_frontend_s``: each request's front-end time (API-server CPU), replacing
        the front-end config's cost model — a replay of measured requests (such a run is not
        planned as a shard: the plan prices the front end with the config's model)."""
        if shard is not None and request_frontend_s is not None:
            raise ValueError("a shard's front-end times are planned: no request_frontend_s")
        self.cfg = cfg
        self.engine_config = resolve_engine_config(cfg)
        self.workload = workload if workload is not None else build_workload(cfg.workload)
        self.cost_model = (
            cost_model if cost_model is not None else make_cost_model(cfg, self.engine_config)
        )
        self.log = EventLog()
        check_router(cfg.router)
        routed = cfg.data_parallel_size > 1
        state_router = routed and cfg.router in STATE_ROUTERS
        open_loop = self.workload.max_concurrency is None
        if (shard is None and routed and not state_router and open_loop
                and request_frontend_s is None):
            # every request's replica is known up front: the whole run is one shard
            shard = plan_shards(
                self.workload, cfg.frontend, self.engine_config.scheduler.max_model_len,
                cfg.router, self._router_inputs(), 1,
            )[0]
        self.shard = shard
        w = self.workload
        stream = StreamInfo(
            seed=cfg.seed, lengths=RequestLengths(w.prompt_lens, w.output_lens),
            has_slos=w.has_slos,
        )
        self.replicas = [
            EngineReplica(
                r, self.engine_config, self.cost_model, cfg.frontend, self.log,
                self._request_done, fast_path=cfg.fast_path,
                closed_loop=self.workload.max_concurrency is not None,
                report_state=state_router, stream=stream,
            )
            for r in (shard.replicas if shard is not None else range(cfg.data_parallel_size))
        ]
        self._local = {replica.index: k for k, replica in enumerate(self.replicas)}
        # Who routes. A shard: its plan (requests go straight to their replica's input queue).
        # Otherwise a router process, asking a router that reads replica state or one that
        # reads none (a closed loop decides the routing order only as it runs).
        self._routed = routed
        self._router_process_needed = routed and shard is None
        self.router: Router | None = None
        self.picker: IndependentRouter | None = None
        if shard is None and state_router:
            self.router = STATE_ROUTERS[cfg.router](self._router_inputs())
        elif shard is None and routed:
            self.picker = INDEPENDENT_ROUTERS[cfg.router](self._router_inputs())
        # the requests this run sends, in send order (None: all of them)
        self._order: np.ndarray | None = shard.requests if shard is not None else None
        self._num_to_send = len(self.workload) if shard is None else len(shard.requests)
        self.api = APIServerPool(cfg.frontend)
        if request_frontend_s is not None and len(request_frontend_s) != len(self.workload):
            raise ValueError("request_frontend_s needs one value per request")
        self._request_frontend_s = request_frontend_s
        self.env = simpy.Environment()
        self.stats = SimStats(num_requests=len(self.workload))
        self.reject_reasons: dict[str, str] = {}
        self._progress = progress
        self._next_send = 0  # index of the next request the client sends
        self._outstanding = 0  # sent, not yet fully delivered (closed loop)
        self._releases: list[float] = []  # future times at which a closed-loop slot frees
        self._engine_wake: list[simpy.Event | None] = [None] * len(self.replicas)
        self._client_wake: simpy.Event | None = None
        # Requests through the API server, awaiting the router: (tokenized time, seq, request)
        self._to_route: list[tuple[float, int, Request]] = []
        self._router_wake: simpy.Event | None = None
        self._routed_to: dict[str, int] = {}
        self._in_flight_per_replica = [0] * len(self.replicas)
        self._completions: list[tuple[float, int]] = []  # (delivered time, replica) to count
        self._params_cache: dict[int, SamplingParams] = {}
        # Open loop: send times are known, so front-end times are computed ahead, in send order.
        self._open_loop = self.workload.max_concurrency is None
        self._frontend_times: list[FrontendTimes | None] = []
        self._bound_for, self._bound = -1, 0.0  # memo of _next_send_bound (open loop)
        # A shard: each replica's own requests (send positions) and, from each on, the earliest
        # engine arrival among them and those after (a replica's horizon need not stop at
        # requests sent to the others).
        self._own_positions: list[list[int]] = []
        self._own_arrival_min: list[list[float]] = []
        self._own_next = [0] * len(self.replicas)
        if shard is not None:
            for replica in self.replicas:
                positions = np.flatnonzero(shard.route == replica.index)
                later_min = np.minimum.accumulate(shard.engine_arrival_s[positions][::-1])[::-1]
                self._own_positions.append(positions.tolist())
                self._own_arrival_min.append([*later_min.tolist(), math.inf])
        self._num_done = 0
        # The workload columns read per request (several times each), copied into typed
        # arrays: a numpy item is a numpy scalar, made then converted at every read (≈ 1 µs of
        # a request's client path); 32 bytes a request, 32 MB at a million.
        self._send_time_s = _float_column(w.send_time_s)
        self._prompt_lens = _int_column(w.prompt_lens)
        self._output_lens = _int_column(w.output_lens)
        self._priorities = _int_column(w.priorities)
        sched = self.engine_config.scheduler
        self._max_model_len = sched.max_model_len
        # refused by the admission rule (1) or not (0), asked once for the whole workload
        self._rejected = array("b", exceeds_max_model_len(
            np.asarray(w.prompt_lens, dtype=np.int64), np.asarray(w.output_lens, dtype=np.int64),
            self._max_model_len,
        ).tobytes())
        self._block_size = self.engine_config.cache.block_size
        self._caching = self.engine_config.cache.enable_prefix_caching
        # asked once: without shared keys a request's keys are all its own (no call per request)
        self._shared_keys = self._caching and w.has_prompt_block_keys()

    def _router_inputs(self) -> RouterInputs:
        cfg = self.cfg
        return RouterInputs(cfg.data_parallel_size, self.workload, cfg.seed, cfg.router_load_cap)

    # -- running --------------------------------------------------------------------------------
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self.env.process(self._client())
        if self._router_process_needed:
            self.env.process(self._router_process())
        for k, replica in enumerate(self.replicas):
            self.env.process(self._engine(k, replica))
        _loop_gc_enter()
        try:
            self.env.run()
        finally:
            _loop_gc_exit()
        for replica in self.replicas:
            if replica.core.held_by_policy:
                raise PolicyError(held_message(replica.core))
        # a shard of several is compacted once the shards are merged (sim/fleet.py)
        if self._routed and len(self.replicas) == self.cfg.data_parallel_size:
            self.log.compact_step_ids(STEP_ID_STRIDE)
        stats = self.stats
        stats.wall_time_s = time.perf_counter() - t0
        stats.simulated_time_s = float(self.env.now)
        stats.num_steps = self.log.num_steps
        stats.num_bulk_steps = sum(r.num_bulk_steps for r in self.replicas)
        stats.num_bulk_runs = sum(r.num_bulk_runs for r in self.replicas)
        stats.api_server_busy_s = (
            self.api.busy_s if self.shard is None else self.shard.api_server_busy_s
        )
        stats.output_processor_busy_s = sum(r.out.busy_s for r in self.replicas)
        for replica in self.replicas:
            self.reject_reasons.update(replica.core.rejected_reasons)
        stats.num_rejected = len(self.reject_reasons)
        return SimResult(
            self.cfg, self.engine_config, self.workload, self.log, stats, self.reject_reasons,
            self.policy_summary(),
        )

    def policy_summary(self) -> dict[str, object]:
        """The scheduling policy of the run, as its metadata records it (``policy_summary``)."""
        policy = self.replicas[0].core.scheduler.policy
        fast_path = describe_bulk(policy) if self.cfg.fast_path else "off (fast_path = false)"
        return policy_summary(policy, self.engine_config.scheduler, fast_path)

    # -- the client -----------------------------------------------------------------------------
    def _client(self) -> Generator[simpy.Event, object, None]:
        env, w = self.env, self.workload
        limit = w.max_concurrency
        send_times = self._send_time_s
        order = self._order
        for pos in range(self._num_to_send):
            i = pos if order is None else int(order[pos])
            if limit is not None:
                while True:
                    while self._releases and self._releases[0] <= env.now:
                        heapq.heappop(self._releases)
                        self._outstanding -= 1
                    if self._outstanding < limit:
                        break
                    # wait for the earliest slot to free, or for a new release: with several
                    # replicas one may report a delivery earlier than those already known
                    self._client_wake = env.event()
                    if self._releases:
                        yield wake_at(env, self._releases[0]) | self._client_wake
                    else:
                        yield self._client_wake
                    self._client_wake = None
            t = send_times[i]
            if t > env.now:
                yield wake_at(env, t)
            self._send(pos, i, env.now)
            self._next_send = pos + 1
        self._next_send = self._num_to_send

    def _send(self, pos: int, i: int, send_s: float) -> None:
        """Request ``i`` (the ``pos``-th this run sends) leaves the client at ``send_s``."""
        w, log, fe = self.workload, self.log, self.cfg.frontend
        req_id = str(i)
        prompt_len = self._prompt_lens[i]
        output_len = self._output_lens[i]
        log.record(req_id, EventKind.ARRIVAL, send_s, prompt_len)
        if w.has_labels:
            slo = w.slo_class(i)
            log.record_labels(req_id, w.tenant(i), "" if slo is None else slo.name)
        self._outstanding += 1
        if self._rejects(i):
            reason = reject_reason(prompt_len, output_len, self._max_model_len)
            assert reason is not None
            self.reject_reasons[req_id] = reason
            self.stats.num_rejected += 1
            back = send_s + 2 * fe.network_latency_s
            log.record(req_id, EventKind.REJECTED, back, reason)
            self._count_done(back)
            return
        times = self._admit(pos, i, send_s)
        log.record(req_id, EventKind.FRONTEND_START, times.frontend_start_s)
        log.record(req_id, EventKind.TOKENIZED, times.tokenized_s)
        request = self._make_request(i, req_id, prompt_len, output_len, send_s)
        if not self._routed:
            self._enqueue(0, times.engine_arrival_s, i, request)
        elif self.shard is not None:
            self._enqueue(int(self.shard.route[pos]), times.engine_arrival_s, i, request)
        else:
            heapq.heappush(self._to_route, (times.tokenized_s, i, request))
            # the router sleeps until its earliest request: wake it if this one is earlier
            if (self._router_wake is not None and not self._router_wake.triggered
                    and self._to_route[0][2] is request):
                self._router_wake.succeed()

    def _enqueue(self, replica: int, arrival_s: float, seq: int, request: Request) -> None:
        """Request ``seq`` reaches the input queue of replica ``replica`` (global index)."""
        k = self._local[replica]
        self.replicas[k].push(arrival_s, seq, request)
        wake = self._engine_wake[k]
        if wake is not None and not wake.triggered:
            wake.succeed()

    def _admit(self, pos: int, i: int, send_s: float) -> FrontendTimes:
        """Front-end times of request ``i``, the ``pos``-th sent (computed in send order; ahead
        of time when the send times are known, so the engine's horizon can be the engine
        arrival itself; given, in a shard)."""
        if self.shard is not None:
            return self._shard_times(pos)
        if not self._open_loop:
            return self.api.admit(send_s + self.cfg.frontend.network_latency_s,
                                  self._prompt_lens[i], self._frontend_cost(i))
        self._admit_ahead(i)
        times = self._frontend_times[i]
        assert times is not None
        self._frontend_times[i] = None  # read once: keep memory flat at a million requests
        return times

    def _shard_times(self, pos: int) -> FrontendTimes:
        shard = self.shard
        assert shard is not None
        return FrontendTimes(float(shard.frontend_start_s[pos]), float(shard.tokenized_s[pos]),
                             float(shard.engine_arrival_s[pos]))

    def _admit_ahead(self, i: int) -> None:
        cached = self._frontend_times
        while len(cached) <= i:
            j = len(cached)
            if self._rejects(j):
                cached.append(None)
                continue
            send = self._send_time_s[j] + self.cfg.frontend.network_latency_s
            cached.append(self.api.admit(send, self._prompt_lens[j],
                                         self._frontend_cost(j)))

    def _frontend_cost(self, i: int) -> float | None:
        """Request ``i``'s replayed front-end time, if the run replays them."""
        costs = self._request_frontend_s
        return None if costs is None else float(costs[i])

    def _rejects(self, i: int) -> bool:
        return self._rejected[i] != 0

    def _make_request(
        self, i: int, req_id: str, prompt_len: int, output_len: int, send_s: float
    ) -> Request:
        params = self._params_cache.get(output_len)
        if params is None:
            params = self._params_cache[output_len] = SamplingParams(
                max_tokens=output_len, ignore_eos=True
            )
        hasher = None
        if self._caching:
            keys = self.workload.prompt_block_keys(i, self._block_size) if self._shared_keys else ()
            hasher = PrecomputedBlockHasher(self._block_size, keys, unique_id=i)
        w = self.workload
        if w.has_labels:
            return Request(
                req_id, sampling_params=params, num_prompt_tokens=prompt_len,
                arrival_time=send_s, priority=self._priorities[i], block_hasher=hasher,
                tenant=w.tenant(i), slo=w.slo_class(i),
            )
        return Request(
            req_id,
            sampling_params=params,
            num_prompt_tokens=prompt_len,
            arrival_time=send_s,
            priority=self._priorities[i],
            block_hasher=hasher,
        )

    def _request_done(self, req_id: str, delivered_s: float) -> None:
        """A request's last chunk reached its client."""
        replica = self._routed_to.pop(req_id, None)
        if replica is not None:
            heapq.heappush(self._completions, (delivered_s, replica))
        self._count_done(delivered_s)

    def _count_done(self, delivered_s: float) -> None:
        self._num_done += 1
        if self.workload.max_concurrency is not None:
            heapq.heappush(self._releases, delivered_s)
            if self._client_wake is not None and not self._client_wake.triggered:
                self._client_wake.succeed()
        if self._progress is not None and self._num_done % 256 == 0:
            self._progress(self._num_done, len(self.workload), delivered_s)

    def _next_send_bound(self) -> float:
        """Earliest time the client's next request could reach the engine (open loop: exactly
        when it will; closed loop: not before its send)."""
        w = self.workload
        pos = self._next_send
        if pos >= self._num_to_send:
            return math.inf
        i = pos if self._order is None else int(self._order[pos])
        if self._open_loop:
            if self._bound_for == pos:
                return self._bound
            self._bound_for = pos
            self._bound = self._send_time_s[i]
            if not self._rejects(i):
                if self.shard is not None:
                    times = self._shard_times(pos)
                else:
                    self._admit_ahead(i)
                    cached = self._frontend_times[i]
                    assert cached is not None
                    times = cached
                routed_later = self._router_process_needed
                self._bound = times.tokenized_s if routed_later else times.engine_arrival_s
            return self._bound
        t = self._send_time_s[i]
        limit = w.max_concurrency
        if limit is not None and self._outstanding >= limit:
            t = max(t, self._releases[0]) if self._releases else math.inf
        return t

    # -- the router (data-parallel runs only) ---------------------------------------------------
    def _router_process(self) -> Generator[simpy.Event, object, None]:
        env = self.env
        ipc = self.cfg.frontend.ipc_latency_s
        while True:
            if not self._to_route:
                if self._next_send >= self._num_to_send:
                    return
                self._router_wake = env.event()
                yield self._router_wake
                self._router_wake = None
                continue
            t = self._to_route[0][0]
            if t > env.now:
                # until then, or until an earlier request leaves an API server (with several
                # API servers, one sent later may be tokenized sooner)
                self._router_wake = env.event()
                yield wake_at(env, t) | self._router_wake
                self._router_wake = None
                continue
            _, seq, request = heapq.heappop(self._to_route)
            replica = self._route(seq, request, env.now)
            self._enqueue(replica, env.now + ipc, seq, request)

    def _route(self, seq: int, request: Request, now: float) -> int:
        """The replica request ``seq`` goes to, routed at ``now``."""
        if self.picker is not None:
            return self.picker.pick(seq)
        assert self.router is not None
        completions = self._completions
        while completions and completions[0][0] <= now:
            _, r = heapq.heappop(completions)
            self._in_flight_per_replica[r] -= 1
        views = []
        for replica in self.replicas:
            running, waiting, usage = replica.reported_state(now)
            kv = replica.core.scheduler.kv_cache_manager
            views.append(ReplicaView(
                index=replica.index,
                num_outstanding=self._in_flight_per_replica[replica.index],
                num_running=running,
                num_waiting=waiting,
                kv_usage=usage,
                cached_prefix_tokens=_prefix_probe(kv),
            ))
        chosen = self.router.choose(request, views)
        self._in_flight_per_replica[chosen] += 1
        self._routed_to[request.req_id] = chosen
        return chosen

    # -- the engines ----------------------------------------------------------------------------
    def _engine(self, k: int, replica: EngineReplica) -> Generator[simpy.Event, object, None]:
        """The engine loop of ``replica`` (the ``k``-th of this run)."""
        env, core = self.env, replica.core
        now = 0.0  # the engine's own clock; may run ahead of env.now up to the horizon
        idle_since: float | None = 0.0  # when the loop last ran out of work (None: busy)
        while True:
            if now < env.now:
                now = env.now
            replica.drain(now)
            if not core.has_work():
                if idle_since is None:
                    idle_since = now
                if (self._next_send >= self._num_to_send and not replica.inputs
                        and not self._to_route):
                    return
                if replica.inputs:
                    now = max(now, replica.next_input_s())
                    yield wake_at(env, now)
                else:
                    wake = self._engine_wake[k] = env.event()
                    yield wake
                    self._engine_wake[k] = None
                continue
            if idle_since is not None:
                replica.woke_up(now - idle_since)
                idle_since = None
            horizon = self._horizon(replica)
            while now < horizon and core.has_work():
                now = replica.iterate(now, horizon)
                replica.drain(now)
                horizon = self._horizon(replica)
            yield wake_at(env, now)

    def _horizon(self, replica: EngineReplica) -> float:
        """Earliest time something outside this engine could change what it sees."""
        if self.shard is not None:  # only its own requests reach it, at planned times
            return min(replica.next_input_s(), self._next_own_arrival(replica.index))
        h = min(replica.next_input_s(), self._next_send_bound())
        if self._to_route:
            h = min(h, self._to_route[0][0])
        return h

    def _next_own_arrival(self, replica: int) -> float:
        """Earliest engine arrival of a request not yet sent to ``replica`` (global index;
        a shard only)."""
        k = self._local[replica]
        positions, p, sent = self._own_positions[k], self._own_next[k], self._next_send
        while p < len(positions) and positions[p] < sent:
            p += 1
        self._own_next[k] = p
        return self._own_arrival_min[k][p]


def _float_column(column: np.ndarray) -> array[float]:
    """``column`` as an array of float64 (its items read back as Python floats)."""
    return array("d", np.ascontiguousarray(column, dtype=np.float64).tobytes())


def _int_column(column: np.ndarray) -> array[int]:
    """``column`` as an array of int64 (its items read back as Python ints)."""
    return array("q", np.ascontiguousarray(column, dtype=np.int64).tobytes())


def _prefix_probe(kv: KVCacheManager) -> Callable[[Request], int]:
    """How many leading tokens of a request this KV cache holds (a prefix-cache lookup)."""

    def probe(request: Request) -> int:
        return kv.get_computed_blocks(request)[1]

    return probe


def run_simulation(
    cfg: SimConfig, *, progress: bool = False, cost_model: CostModel | None = None
) -> SimResult:
    """Run ``cfg`` to completion (optionally printing progress to stderr).

    The finished runtime is collected before returning: its engines, queues and processes
    refer to each other (and to the event log), so without a collection they, and the log,
    would outlive the result until the next full one; the result is then all that holds the
    log, and a caller that lets go of it frees the log at once (a million-request log is
    ≈ 0.7 GB). That collection walks only what the run made (the process's older objects are
    frozen meanwhile): garbage the caller left before the call waits for the next automatic
    collection."""
    reporter = _ProgressLine() if progress else None
    _loop_gc_enter()  # before the runtime is built: see the docstring (run() nests)
    try:
        runtime = SimRuntime(cfg, cost_model=cost_model, progress=reporter)
        result = runtime.run()
        del runtime
        gc.collect()
    finally:
        _loop_gc_exit()
    if reporter is not None:
        reporter.finish(result.stats.num_requests)
    return result


class _ProgressLine:
    """A one-line progress indicator on stderr, refreshed at most a few times a second."""

    def __init__(self) -> None:
        self._last = 0.0
        self._start = time.perf_counter()

    def __call__(self, done: int, total: int, sim_time_s: float) -> None:
        now = time.perf_counter()
        if now - self._last < 0.25:
            return
        self._last = now
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests, "
            f"simulated {sim_time_s:,.1f} s, wall {now - self._start:.1f} s"
        )
        sys.stderr.flush()

    def finish(self, total: int) -> None:
        if self._last:
            self(total, total, 0.0)
            sys.stderr.write("\n")
