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
* each step's outputs go over IPC to the **output processor** (``stages.OutputProcessor``) and
  over the network to the clients.

Every stage writes the core's event records. For speed the engine runs ahead of the SimPy
clock up to the *horizon* — the earliest time anything outside the engine could change what it
sees (the next request reaching its input queue, or the client's next possible send) — and
applies runs of identical decode steps in bulk (``engine.core.fast_forward``), exactly.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from engine.core.config import EngineConfig
from engine.core.engine_core import EngineCore, RunTiming
from engine.core.events import EventKind, EventLog
from engine.core.hashing import PrecomputedBlockHasher
from engine.core.interfaces import CostModel
from engine.core.outputs import BatchShape, EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, SamplingParams
from sim.config import SimConfig, resolve_engine_config
from sim.executor import PLACEHOLDER_TOKEN_ID, SimExecutor
from sim.stages import APIServerPool, FrontendTimes, OutputProcessor
from sim.workload import Workload, build_workload

#: Bulk runs shorter than this are executed step by step (finding one costs O(running)).
MIN_BULK_ITERATIONS = 2


@dataclass(slots=True)
class SimStats:
    """Counters of one run (for reports and benchmarks)."""

    num_requests: int = 0
    num_rejected: int = 0
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


def make_cost_model(cfg: SimConfig) -> CostModel:
    """The cost model ``cfg.cost_model`` names."""
    if cfg.cost_model == "roofline":
        from sim.cost.roofline import RooflineCostModel

        return RooflineCostModel(
            cfg.model_spec, cfg.gpu_spec, cfg.tensor_parallel_size, cfg.roofline
        )
    from sim.cost.fitted import FittedCostModel

    return FittedCostModel.load(cfg.cost_model.split(":", 1)[1])


class SimRuntime:
    """One simulated run of ``cfg`` (a pure function of it: same config, same event log)."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        workload: Workload | None = None,
        cost_model: CostModel | None = None,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine_config = resolve_engine_config(cfg)
        self.workload = workload if workload is not None else build_workload(cfg.workload)
        self.cost_model = cost_model if cost_model is not None else make_cost_model(cfg)
        self.executor = SimExecutor(self.cost_model)
        self.log = EventLog()
        self.core = EngineCore(self.engine_config, self.log)
        self.api = APIServerPool(cfg.frontend)
        self.out = OutputProcessor(cfg.frontend)
        self.env = simpy.Environment()
        self.stats = SimStats(num_requests=len(self.workload))
        self.reject_reasons: dict[str, str] = {}
        self._progress = progress
        # engine inputs: (engine arrival time, seq, request)
        self._inputs: list[tuple[float, int, Request]] = []
        self._next_send = 0  # index of the next request the client sends
        self._outstanding = 0  # sent, not yet fully delivered (closed loop)
        self._releases: list[float] = []  # future times at which a closed-loop slot frees
        self._engine_wake: simpy.Event | None = None
        self._client_wake: simpy.Event | None = None
        self._gpu_free_s = 0.0
        self._pending: dict[int, tuple[float, float, float]] = {}  # step -> start, end, cost
        self._params_cache: dict[int, SamplingParams] = {}
        # Open loop: send times are known, so front-end times are computed ahead, in send order.
        self._open_loop = self.workload.max_concurrency is None
        self._frontend_times: list[FrontendTimes | None] = []
        self._num_done = 0
        sched = self.engine_config.scheduler
        self._max_model_len = sched.max_model_len
        self._block_size = self.engine_config.cache.block_size
        self._caching = self.engine_config.cache.enable_prefix_caching

    # -- running --------------------------------------------------------------------------------
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self.env.process(self._client())
        self.env.process(self._engine())
        self.env.run()
        stats = self.stats
        stats.wall_time_s = time.perf_counter() - t0
        stats.simulated_time_s = self.env.now
        stats.num_steps = self.log.num_steps
        stats.api_server_busy_s = self.api.busy_s
        stats.output_processor_busy_s = self.out.busy_s
        return SimResult(
            self.cfg, self.engine_config, self.workload, self.log, stats, self.reject_reasons
        )

    # -- the client -----------------------------------------------------------------------------
    def _client(self):  # type: ignore[no-untyped-def]
        env, w = self.env, self.workload
        limit = w.max_concurrency
        send_times = w.send_time_s
        for i in range(len(w)):
            if limit is not None:
                while True:
                    while self._releases and self._releases[0] <= env.now:
                        heapq.heappop(self._releases)
                        self._outstanding -= 1
                    if self._outstanding < limit:
                        break
                    if self._releases:
                        yield env.timeout(self._releases[0] - env.now)
                    else:
                        self._client_wake = env.event()
                        yield self._client_wake
                        self._client_wake = None
            t = float(send_times[i])
            if t > env.now:
                yield env.timeout(t - env.now)
            self._send(i, env.now)
            self._next_send = i + 1
        self._next_send = len(w)

    def _send(self, i: int, send_s: float) -> None:
        w, log, fe = self.workload, self.log, self.cfg.frontend
        req_id = str(i)
        prompt_len = int(w.prompt_lens[i])
        output_len = int(w.output_lens[i])
        log.record(req_id, EventKind.ARRIVAL, send_s, prompt_len)
        self._outstanding += 1
        if self._rejects(i):
            reason = (
                f"prompt ({prompt_len}) + max_tokens ({output_len}) exceeds max_model_len "
                f"({self._max_model_len})"
            )
            self.reject_reasons[req_id] = reason
            self.stats.num_rejected += 1
            back = send_s + 2 * fe.network_latency_s
            log.record(req_id, EventKind.REJECTED, back, reason)
            self._request_done(back)
            return
        times = self._admit(i, send_s)
        log.record(req_id, EventKind.FRONTEND_START, times.frontend_start_s)
        log.record(req_id, EventKind.TOKENIZED, times.tokenized_s)
        request = self._make_request(i, req_id, prompt_len, output_len, send_s)
        heapq.heappush(self._inputs, (times.engine_arrival_s, i, request))
        if self._engine_wake is not None and not self._engine_wake.triggered:
            self._engine_wake.succeed()

    def _admit(self, i: int, send_s: float) -> FrontendTimes:
        """Front-end times of request ``i`` (computed in send order; ahead of time when the
        send times are known, so the engine's horizon can be the engine arrival itself)."""
        if not self._open_loop:
            return self.api.admit(send_s + self.cfg.frontend.network_latency_s,
                                  int(self.workload.prompt_lens[i]))
        self._admit_ahead(i)
        times = self._frontend_times[i]
        assert times is not None
        self._frontend_times[i] = None  # read once: keep memory flat at a million requests
        return times

    def _admit_ahead(self, i: int) -> None:
        cached = self._frontend_times
        while len(cached) <= i:
            j = len(cached)
            if self._rejects(j):
                cached.append(None)
                continue
            send = float(self.workload.send_time_s[j]) + self.cfg.frontend.network_latency_s
            cached.append(self.api.admit(send, int(self.workload.prompt_lens[j])))

    def _rejects(self, i: int) -> bool:
        w = self.workload
        return int(w.prompt_lens[i]) + int(w.output_lens[i]) > self._max_model_len

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
            keys = self.workload.prompt_block_keys(i, self._block_size)
            hasher = PrecomputedBlockHasher(self._block_size, keys, unique_id=i)
        return Request(
            req_id,
            sampling_params=params,
            num_prompt_tokens=prompt_len,
            arrival_time=send_s,
            priority=int(self.workload.priorities[i]),
            block_hasher=hasher,
        )

    def _request_done(self, delivered_s: float) -> None:
        """A request's last chunk reached its client: free its closed-loop slot then."""
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
        i = self._next_send
        if i >= len(w):
            return math.inf
        if self._open_loop and not self._rejects(i):
            self._admit_ahead(i)
            times = self._frontend_times[i]
            assert times is not None
            return times.engine_arrival_s
        t = float(w.send_time_s[i])
        limit = w.max_concurrency
        if limit is not None and self._outstanding >= limit:
            t = max(t, self._releases[0]) if self._releases else math.inf
        return t

    # -- the engine -----------------------------------------------------------------------------
    def _engine(self):  # type: ignore[no-untyped-def]
        env, core = self.env, self.core
        now = 0.0  # the engine's own clock; may run ahead of env.now up to the horizon
        while True:
            if now < env.now:
                now = env.now
            self._drain(now)
            if not core.has_work():
                if self._next_send >= len(self.workload) and not self._inputs:
                    return
                if self._inputs:
                    now = max(now, self._inputs[0][0])
                    yield env.timeout(now - env.now)
                else:
                    self._engine_wake = env.event()
                    yield self._engine_wake
                    self._engine_wake = None
                continue
            horizon = self._horizon()
            while now < horizon and core.has_work():
                now = self._iteration(now, horizon)
                self._drain(now)
                horizon = self._horizon()
            yield env.timeout(now - env.now)

    def _horizon(self) -> float:
        nxt = self._inputs[0][0] if self._inputs else math.inf
        return min(nxt, self._next_send_bound())

    def _drain(self, now: float) -> None:
        inputs, core = self._inputs, self.core
        while inputs and inputs[0][0] <= now:
            _, _, request = heapq.heappop(inputs)
            core.add_request(request, now)

    def _iteration(self, now: float, horizon: float) -> float:
        if self.cfg.fast_path:
            after = self._bulk_iterations(now, horizon)
            if after is not None:
                return after
        return self._one_iteration(now)

    def _one_iteration(self, now: float) -> float:
        """vLLM's busy-loop body, step by step."""
        core, fe = self.core, self.cfg.frontend
        out = core.begin_step(now)
        if out is not None:
            now += fe.schedule_overhead_s + fe.schedule_s_per_request * len(
                out.num_scheduled_tokens
            )
            cost = self.executor.step_time(out).total_s
            start = now if now > self._gpu_free_s else self._gpu_free_s
            self._gpu_free_s = start + cost
            self._pending[out.step_id] = (start, start + cost, cost)
        if core.must_finish_step():
            oldest = core.oldest_in_flight()
            start, end, cost = self._pending.pop(oldest.step_id)
            if end > now:
                now = end
            outputs = core.finish_step(
                oldest, self._sampled(oldest, cost), now, execute_start_s=start, execute_end_s=end
            )
            self._deliver(oldest.step_id, now, outputs)
            now += fe.update_overhead_s
        return now

    def _sampled(self, out: SchedulerOutput, cost: float) -> ModelRunnerOutput:
        partial = out.partial_prefill_req_ids
        token = [PLACEHOLDER_TOKEN_ID]
        return ModelRunnerOutput(
            {r: token for r in out.num_scheduled_tokens if r not in partial}, execute_time_s=cost
        )

    def _deliver(self, step_id: int, update_s: float, outputs: list[EngineCoreOutput]) -> None:
        if not outputs:
            return
        delivered = self.out.process(update_s, sum(len(o.new_token_ids) for o in outputs))
        self.log.record_delivery(step_id, delivered)
        for o in outputs:
            if o.finish_reason is not None:
                self.log.record(o.req_id, EventKind.DELIVERED, delivered)
                self._request_done(delivered)

    # -- bulk decode runs -----------------------------------------------------------------------
    def _bulk_iterations(self, now: float, horizon: float) -> float | None:
        """Apply as many identical decode iterations as fit before ``horizon``; None if the
        state is not a uniform decode run (or the run would be too short)."""
        core = self.core
        run = core.find_uniform_decode_run(PLACEHOLDER_TOKEN_ID)
        if run is None or run.max_iterations < MIN_BULK_ITERATIONS:
            return None
        fe = self.cfg.frontend
        n = run.num_reqs
        c_sched = fe.schedule_overhead_s + fe.schedule_s_per_request * n
        c_update = fe.update_overhead_s
        cost_of = self._decode_cost_fn(n, run.context_sum, run.context_max)
        sched_t: list[float] = []
        starts: list[float] = []
        ends: list[float] = []
        updates: list[float] = []
        applied_costs: list[float] = []
        t = now
        if run.is_async:
            prev_id = core.oldest_in_flight().step_id
            prev_start, prev_end, prev_cost = self._pending[prev_id]
            for k in range(run.max_iterations):
                if t >= horizon:
                    break
                sched_t.append(t)
                t1 = t + c_sched
                update = t1 if t1 > prev_end else prev_end
                cost = cost_of(k)
                starts.append(prev_start)
                ends.append(prev_end)
                applied_costs.append(prev_cost)
                updates.append(update)
                # the GPU takes the new batch as soon as it is submitted and free
                prev_start, prev_end, prev_cost = update, update + cost, cost
                t = update + c_update
        else:
            for k in range(run.max_iterations):
                if t >= horizon:
                    break
                sched_t.append(t)
                cost = cost_of(k)
                start = t + c_sched
                end = start + cost
                starts.append(start)
                ends.append(end)
                updates.append(end)
                applied_costs.append(cost)
                t = end + c_update
        m = len(sched_t)
        if m < MIN_BULK_ITERATIONS:
            return None
        applied = core.apply_uniform_decode(
            run, m, PLACEHOLDER_TOKEN_ID,
            RunTiming(sched_t, starts, ends, updates, applied_costs),
        )
        if run.is_async:
            del self._pending[prev_id]
            assert applied.last_scheduled is not None
            self._pending[applied.last_scheduled.step_id] = (prev_start, prev_end, prev_cost)
            self._gpu_free_s = prev_end
        else:
            self._gpu_free_s = ends[-1]
        delivered = self.out.process_many(updates, n)
        for step_id, d in zip(applied.applied_step_ids, delivered, strict=True):
            self.log.record_delivery(step_id, d)
        self.stats.num_bulk_steps += m
        self.stats.num_bulk_runs += 1
        return t

    def _decode_cost_fn(self, n: int, ctx_sum: int, ctx_max: int) -> Callable[[int], float]:
        """Duration of the k-th step of a uniform decode run of ``n`` requests (contexts grow
        by one per step); the cost model's ``decode_step_total`` when it has one (bit-identical
        to ``step_time``, and faster)."""
        model = self.cost_model
        fast = getattr(model, "decode_step_total", None)
        if fast is not None:
            return lambda k: float(fast(n, ctx_sum + n * k))

        def slow(k: int) -> float:
            shape = BatchShape(n, n, (), (), n, ctx_sum + n * k, ctx_max + k, n)
            return model.step_time(shape).total_s

        return slow


def run_simulation(
    cfg: SimConfig, *, progress: bool = False, cost_model: CostModel | None = None
) -> SimResult:
    """Run ``cfg`` to completion (optionally printing progress to stderr)."""
    reporter = _ProgressLine() if progress else None
    runtime = SimRuntime(cfg, cost_model=cost_model, progress=reporter)
    result = runtime.run()
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
