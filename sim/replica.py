"""One simulated engine replica: the shared core's busy loop on a simulated GPU timeline.

``EngineReplica.iterate`` is one pass of vLLM's engine loop (``step_with_batch_queue``): drain
arrived inputs, ``begin_step`` (the scheduler's CPU time is a cost term), submit the batch to
the GPU (it starts when both it and the GPU are ready, and lasts the cost model's step time),
and, when the batch queue says so, wait for the oldest batch and ``finish_step`` it. Each
applied step's outputs go through this replica's output processor to the clients.

When the engine state is a uniform decode run (``engine/core/bulk``) the replica
applies as many identical iterations as fit before its horizon in one go, computing the same
timeline the step-by-step loop would.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Final

from engine.core.bulk.records import AppliedRun, RunTiming
from engine.core.bulk.run import BulkRun
from engine.core.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.events import EventKind, EventLog
from engine.core.interfaces import CostModel
from engine.core.outputs import EngineCoreOutput, SchedulerOutput
from engine.core.policy import StreamInfo
from engine.core.request import Request
from sim.config import FrontendConfig
from sim.executor import PLACEHOLDER_TOKEN_ID, SimExecutor
from sim.stages import OutputStage

#: Bulk runs shorter than this are executed step by step (finding one costs O(running)).
MIN_BULK_ITERATIONS: Final = 2

#: Step ids of replica r start at r × STEP_ID_STRIDE, so they never collide in a shared log.
STEP_ID_STRIDE: Final = 10**12


class EngineReplica:
    """An ``EngineCore`` with its input queue, GPU timeline and output processor."""

    def __init__(
        self,
        index: int,
        engine_config: EngineConfig,
        cost_model: CostModel,
        frontend: FrontendConfig,
        log: EventLog,
        on_request_done: Callable[[str, float], None],
        *,
        fast_path: bool = True,
        closed_loop: bool = False,
        report_state: bool = False,
        stream: StreamInfo | None = None,
    ) -> None:
        self.index = index
        self.core = EngineCore(
            engine_config, log, replica=index, first_step_id=index * STEP_ID_STRIDE,
            stream=stream,  # its scheduling policy is built from what it says of the requests
        )
        self.executor = SimExecutor(cost_model)  # the one way to the cost model
        self.frontend = frontend
        self.log = log
        self.out = OutputStage(frontend)
        self.fast_path = fast_path
        self.closed_loop = closed_loop  # finishes free client slots: bulk runs stop there
        self.report_state = report_state  # keep per-step state reports for a router
        self._on_request_done = on_request_done
        self.inputs: list[tuple[float, int, Request]] = []  # (engine arrival, seq, request)
        self._gpu_free_s = 0.0
        # pipeline stages: when each stage's GPUs are free (PP > 1 only)
        self._stage_free_s = [0.0] * engine_config.pipeline_parallel_size
        self._pending: dict[int, tuple[float, float, float]] = {}  # step -> start, end, cost
        # (update time, running, waiting, kv usage) reported by recent steps, for routers
        self._reports: deque[tuple[float, int, int, float]] = deque()
        self._last_report: tuple[int, int, float] = (0, 0, 0.0)
        self.num_bulk_steps = 0
        self.num_bulk_runs = 0
        self._wakeup_s = 0.0  # extra time owed by the next step (the loop just woke up)
        # requests whose first output went through the output processor (it pays
        # FrontendConfig.first_output_overhead_s for each one once); finished ones leave
        self._started: set[str] = set()
        self._last_cost_s = 0.0  # the last bulk step's duration (to size the next run's shapes)
        self._last_step_cost_s = 0.0  # the last step's duration, either path (whether to search)

    # -- inputs ---------------------------------------------------------------------------------
    def push(self, arrival_s: float, seq: int, request: Request) -> None:
        heapq.heappush(self.inputs, (arrival_s, seq, request))

    def next_input_s(self) -> float:
        return self.inputs[0][0] if self.inputs else float("inf")

    def drain(self, now: float) -> None:
        inputs, core = self.inputs, self.core
        while inputs and inputs[0][0] <= now:
            _, _, request = heapq.heappop(inputs)
            core.add_request(request, now)

    def reported_state(self, at_s: float) -> tuple[int, int, float]:
        """(running, waiting, KV usage) as the last step applied by ``at_s`` reported them."""
        reports = self._reports
        while reports and reports[0][0] <= at_s:
            _, running, waiting, usage = reports.popleft()
            self._last_report = (running, waiting, usage)
        return self._last_report

    # -- the loop -------------------------------------------------------------------------------
    def woke_up(self, idle_s: float) -> None:
        """The loop had nothing to do for ``idle_s`` seconds: its next step pays the
        front-end config's wake-up cost (``FrontendConfig.wakeup_s``)."""
        self._wakeup_s = self.frontend.wakeup_s(idle_s)

    def iterate(self, now: float, horizon: float) -> float:
        """One loop pass (or a bulk run of them) starting at engine time ``now``."""
        if self.fast_path and not self._wakeup_s and not self._horizon_within_a_step(now, horizon):
            after = self._bulk_iterations(now, horizon)
            if after is not None:
                return after
        return self._one_iteration(now)

    def _horizon_within_a_step(self, now: float, horizon: float) -> bool:
        """Is ``horizon`` (the next arrival) closer than one step at the last step's cost? A
        run found now would then usually end before its second iteration and be dropped
        (``MIN_BULK_ITERATIONS``), its search — a walk over every running request — wasted:
        the step goes step by step without one. Speed only: both paths make the same records.
        Both paths update the cost, so a long step (a prefill) stops searches only until the
        next step. At 20 req/s on Llama-3.1-8B (a new request every 4–5 steps) this skips
        ~40% of the searches and 8–13% of the loop's CPU; where runs are long it rarely
        fires."""
        return horizon - now < self._last_step_cost_s

    def _one_iteration(self, now: float) -> float:
        core, fe = self.core, self.frontend
        out = core.begin_step(now)
        if out is not None and self.executor.pipelined:
            now = self._submit_to_pipeline(out, now)
        elif out is not None:
            now += fe.schedule_overhead_s + fe.schedule_s_per_request * len(
                out.num_scheduled_tokens
            )
            step = self.executor.step_time(out)
            cost = step.total_s
            if self._wakeup_s and out.total_num_scheduled_tokens:
                cost += self._wakeup_s
                self._wakeup_s = 0.0
            # the worker prepares the inputs, then launches while the GPU runs: the GPU starts
            # when both the first launch and the GPU are ready; the CPU is busy until the last
            # launch (with async scheduling that overlaps the previous step on the GPU)
            ready = now + step.host_s
            start = ready if ready > self._gpu_free_s else self._gpu_free_s
            now = ready + step.launch_s
            self._gpu_free_s = start + cost
            self._pending[out.step_id] = (start, start + cost, cost)
            self._last_step_cost_s = cost
        if core.must_finish_step():
            oldest = core.oldest_in_flight()
            start, end, cost = self._pending.pop(oldest.step_id)
            if end > now:
                now = end
            outputs = core.finish_step(
                oldest, self.executor.sampled(oldest, cost), now, execute_start_s=start,
                execute_end_s=end,
            )
            self._report(now)
            self._deliver(oldest.step_id, now, outputs)
            now += fe.update_overhead_s
        return now

    def _submit_to_pipeline(self, out: SchedulerOutput, now: float) -> float:
        """Schedule ``out`` on the pipeline: after the host prepares it, stage ``s`` runs it
        when the batch has reached it and the stage is free; each stage but the last then
        sends the hidden states on (its GPUs busy meanwhile). Returns the engine's time after
        the launch. A stage idle while waiting is a bubble."""
        fe = self.frontend
        now += fe.schedule_overhead_s + fe.schedule_s_per_request * len(out.num_scheduled_tokens)
        pipe = self.executor.stage_times(out)
        assert pipe is not None
        ready = now + pipe.host_s
        stage_free = self._stage_free_s
        stage_s = list(pipe.stage_s)
        if self._wakeup_s and out.total_num_scheduled_tokens:
            stage_s[0] += self._wakeup_s
            self._wakeup_s = 0.0
        t = ready
        start = -1.0
        for s, duration in enumerate(stage_s):
            begin = t if t > stage_free[s] else stage_free[s]
            if start < 0.0:
                start = begin
            t = begin + duration
            if s < len(pipe.send_s):
                t += pipe.send_s[s]
            stage_free[s] = t
        self._pending[out.step_id] = (start, t, t - start)
        return ready + pipe.launch_s

    def _report(self, update_s: float) -> None:
        if not self.report_state:
            return
        sched = self.core.scheduler
        self._reports.append(
            (update_s, len(sched.running), len(sched.waiting), sched.kv_cache_manager.usage)
        )

    def _deliver(self, step_id: int, update_s: float, outputs: list[EngineCoreOutput]) -> None:
        if not outputs:
            return
        started = self._started
        num_first = 0
        for o in outputs:
            if o.new_token_ids and o.req_id not in started:
                started.add(o.req_id)
                num_first += 1
        delivered = self.out.process(
            update_s, sum(len(o.new_token_ids) for o in outputs), num_first
        )
        self.log.record_delivery(step_id, delivered)
        for o in outputs:
            if o.finish_reason is not None:
                started.discard(o.req_id)
                if o.req_id not in self.core.rejected_reasons:  # (a shed one was REJECTED)
                    self.log.record(o.req_id, EventKind.DELIVERED, delivered)
                self._on_request_done(o.req_id, delivered)

    # -- bulk runs ------------------------------------------------------------------------------
    def _bulk_iterations(self, now: float, horizon: float) -> float | None:
        """Apply the bulk-run iterations that start before ``horizon`` (closed loop: also
        before a finished request's client could send again); None if the state is not a
        bulk run or the run would be too short."""
        core = self.core
        run = core.find_bulk_run(PLACEHOLDER_TOKEN_ID)
        if run is None or run.max_iterations < MIN_BULK_ITERATIONS:
            return None
        fe = self.frontend
        per_req, sched_base, c_update = (
            fe.schedule_s_per_request, fe.schedule_overhead_s, fe.update_overhead_s
        )
        executor = self.executor
        sched_t: list[float] = []
        starts: list[float] = []
        ends: list[float] = []
        updates: list[float] = []
        costs: list[float] = []
        tokens: list[int] = []  # tokens each applied step delivers
        firsts: list[int] = []  # of which requests' first outputs
        is_async = run.is_async
        t = now
        prev_id = -1
        prev_start = prev_end = prev_cost = 0.0
        prev_tokens = 0
        prev_firsts = 0
        prev_new: list[str] = []  # the in-flight step's requests that sample a first token
        if is_async:
            prev = core.oldest_in_flight()
            prev_id = prev.step_id
            prev_start, prev_end, prev_cost = self._pending[prev_id]
            prev_tokens = len(prev.num_scheduled_tokens) - len(prev.partial_prefill_req_ids)
            partial, started = prev.partial_prefill_req_ids, self._started
            prev_new = [r for r in prev.num_scheduled_tokens
                        if r not in partial and r not in started]
            prev_firsts = len(prev_new)
        # decoders that have not had an output yet (e.g. a one-token prompt): their first
        # iteration samples their first token
        fresh = self._fresh_decoders(run, prev_new)
        decoding, context_sum = run.decoding, run.context_sum
        num_prefill = run.num_prefill_iterations
        finish_iters = run.finish_iters
        next_finish = 0  # position in finish_iters of the next finish
        # as many shapes as the horizon leaves room for at the last step's pace (more later)
        estimate = 1
        if self._last_cost_s > 0.0 and horizon < float("inf"):
            estimate = min(int((horizon - now) / self._last_cost_s) + 2, 1 << 16)
        available = run.ensure_shapes(estimate)
        host_n, decode_host, decode_launch = -1, 0.0, 0.0  # decode_host_s of the last size
        k = 0
        while t < horizon:
            if k >= available:
                available = run.ensure_shapes(k + 1)
                num_prefill = run.num_prefill_iterations
                if k >= available:
                    break
            n = decoding[k]
            host = launch = 0.0
            first = len(fresh) if k == 0 else 0  # first tokens this iteration samples
            if k < num_prefill:  # a prefill chunk too: the full model
                t1 = t + (sched_base + per_req * (n + 1))  # the step-by-step path's sum
                sampling = run.num_sampling(k)
                # the prefiller's last chunk samples its first token (unless it is a request
                # resumed after a preemption, which had its first output before)
                if sampling > n and run.requests[run.prefill_index].req_id not in self._started:
                    first += sampling - n
                step = executor.shape_time(run.batch_shape(k))
                cost, host, launch = step.total_s, step.host_s, step.launch_s
            else:
                t1 = t + (sched_base + per_req * n)
                sampling = n
                cost = executor.decode_time_s(n, context_sum[k], run.context_max[k])
                if n != host_n:  # the batch size changes only when a request finishes
                    host_n = n
                    decode_host, decode_launch = executor.decode_host_s(n)
                host, launch = decode_host, decode_launch
            ready = t1 + host  # the step-by-step path's order of additions
            cpu_free = ready + launch
            sched_t.append(t)
            if is_async:
                update = cpu_free if cpu_free > prev_end else prev_end
                starts.append(prev_start)
                ends.append(prev_end)
                costs.append(prev_cost)
                tokens.append(prev_tokens)
                firsts.append(prev_firsts)
                # the GPU takes the new batch as soon as it is launched and free
                start = ready if ready > prev_end else prev_end
                prev_start, prev_end, prev_cost = start, start + cost, cost
                prev_tokens = sampling
                prev_firsts = first
            else:
                end = ready + cost
                update = end if end > cpu_free else cpu_free
                starts.append(ready)
                ends.append(end)
                costs.append(cost)
                tokens.append(sampling)
                firsts.append(first)
            updates.append(update)
            t = update + c_update
            if self.closed_loop:
                finished = False
                while next_finish < len(finish_iters) and finish_iters[next_finish] <= k:
                    next_finish += 1
                    finished = True
                if finished:
                    # a freed client slot may send a request: stop at its delivery
                    planned = self.out.plan(updates, tokens, firsts)
                    horizon = min(horizon, planned[-1])
            k += 1
        if k < MIN_BULK_ITERATIONS:
            return None
        applied = core.apply_bulk_run(
            run, k, PLACEHOLDER_TOKEN_ID, RunTiming(sched_t, starts, ends, updates, costs)
        )
        if costs:
            self._last_cost_s = self._last_step_cost_s = costs[-1]
        if is_async:
            del self._pending[prev_id]
            assert applied.last_scheduled is not None
            self._pending[applied.last_scheduled.step_id] = (prev_start, prev_end, prev_cost)
            self._gpu_free_s = prev_end
        else:
            self._gpu_free_s = ends[-1]
        self._record_bulk(run, applied, updates, tokens, firsts, [*prev_new, *fresh])
        self.num_bulk_steps += k
        self.num_bulk_runs += 1
        return t

    def _record_bulk(
        self,
        run: BulkRun,
        applied: AppliedRun,
        updates: list[float],
        tokens: list[int],
        firsts: list[int],
        new: list[str],
    ) -> None:
        """Deliveries, finishes and router reports of a bulk-applied run (``new``: the
        requests whose first token the run's first delivered step carries)."""
        sched = self.core.scheduler
        if self.report_state:
            usable = sched.kv_cache_manager.block_pool.num_gpu_blocks - 1
            waiting = len(sched.waiting)
            for u, running, free in zip(
                updates, applied.num_running_after, applied.free_blocks_after, strict=True
            ):
                self._reports.append((u, running, waiting, 1.0 - free / usable))
        first = applied.applied_step_ids.start
        step_ids, delivered = self.out.deliver_steps(first, updates, tokens, firsts)
        log = self.log
        log.record_deliveries(step_ids, delivered)
        self._mark_started(run, applied, new)
        if not step_ids:
            return
        requests, order, iters = run.requests, run.finish_order, run.finish_iters
        j = 0  # walk the delivering steps (increasing) alongside the finishes (by iteration)
        for pos in range(len(iters)):
            f = iters[pos]
            if f >= applied.num_iterations:
                break
            while step_ids[j] < first + f:
                j += 1
            d = delivered[j]  # a finishing step always delivers its last token
            req_id = requests[order[pos]].req_id
            self._started.discard(req_id)
            log.record(req_id, EventKind.DELIVERED, d)
            self._on_request_done(req_id, d)

    def _fresh_decoders(self, run: BulkRun, prev_new: list[str]) -> list[str]:
        """The run's decoders (the prefiller aside) with no output delivered or in flight."""
        started, in_flight = self._started, set(prev_new)
        return [r.req_id for i, r in enumerate(run.requests)
                if i != run.prefill_index and r.req_id not in started
                and r.req_id not in in_flight]

    def _mark_started(self, run: BulkRun, applied: AppliedRun, new: list[str]) -> None:
        """The requests whose first output the bulk run delivered: ``new`` (the in-flight
        step's and the fresh decoders') and the prefiller, when the step of its last chunk was
        applied and delivered (under async scheduling the run's last step is still in flight:
        the step path delivers it)."""
        started = self._started
        delivered_iters = applied.num_iterations - (1 if run.is_async else 0)
        if delivered_iters > 0 or run.is_async:
            started.update(new)
        if run.prefill_index >= 0 and 0 <= run.prefill_done_iteration < delivered_iters:
            started.add(run.requests[run.prefill_index].req_id)
