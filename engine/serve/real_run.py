"""The real-run driver: replay a workload's arrivals in wall-clock time into the real engine.

What ``twinserve run-real`` and the simulator's validation measure. It sits beside
``engine_loop.py``, whose ``EngineLoop`` it drives, and takes its requests from ``workload``,
the package the simulator takes them from too.

Before the clock starts the engine serves one short warm-up request (first-call costs of torch
and the kernels), on a core that is then replaced by a fresh one.

The same workload a simulation would serve (``workload``) is turned into token ids
(``workload.prompts``: seeded random tokens of the model's vocabulary, with shared prefixes
and Mooncake prefix identities turned into shared token blocks), sent at their send times (open
loop) or whenever one of ``max_concurrency`` slots frees (closed loop), and served by an
in-process engine loop: the core's ``begin_step``/``finish_step`` with the ``TorchExecutor``,
async batch queue included (``engine.serve.engine_loop.EngineLoop``). Requests stop at their
workload output length (``ignore_eos``), as in the simulator.

Every stage writes the same event records as the simulated world, on the same time base (0 =
start of the run), so the report and a simulated-vs-measured comparison are joins on one record
type — request labels (tenant, SLO class) and the scheduling policy's rejections included: the
core's policy is built from the same ``StreamInfo`` a simulation gives it. There is no separate
front-end process and prompts are token ids already, so the front end costs nothing here
(FRONTEND_START = TOKENIZED = the send time); a request sent while the loop is busy waits for
the next engine iteration, which the report shows as IPC/engine-loop wait (TOKENIZED →
ENGINE_ENQUEUED).

Time comes from a ``RunClock`` (the wall clock by default); a test may give a clock of its own,
advanced by a scripted executor, to make a real run's decisions reproducible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.events import EventKind, EventLog
from engine.core.policy import (
    PolicyError,
    RequestLengths,
    StreamInfo,
    held_message,
    policy_summary,
)
from engine.core.request import SamplingParams
from engine.llm import RealEngine
from engine.serve.engine_loop import EngineLoop
from engine.serve.output_processor import OutputProcessor
from workload.admission import reject_reason
from workload.prompts import FIRST_PLAIN_TOKEN, synthetic_prompts
from workload.stream import Workload


def warm_up(engine: RealEngine) -> None:
    """Serve one short request, then give the engine a fresh core (and event log)."""
    n = min(32, engine.engine_config.scheduler.max_model_len - 4)
    params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0)
    request = engine.make_request("warm-up", [FIRST_PLAIN_TOKEN] * n, params, arrival_time=0.0)
    throwaway = engine.new_core()  # never the core whose log is reported
    throwaway.add_request(request, 0.0)
    loop = EngineLoop(throwaway, engine.executor, lambda: 0.0)
    while loop.has_work():
        loop.step()
    engine.core = engine.new_core()


def stream_info(workload: Workload, seed: int) -> StreamInfo:
    """What a run of ``workload`` tells its scheduling policy in advance (as the simulator
    does): the seed, the requests' lengths, whether they carry SLO classes."""
    return StreamInfo(
        seed=seed,
        lengths=RequestLengths(workload.prompt_lens, workload.output_lens),
        has_slos=workload.has_slos,
    )


class RunClock(Protocol):
    """Where a real run's time comes from."""

    def now(self) -> float: ...  # seconds, monotonic

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The wall clock: ``time.perf_counter`` and ``time.sleep``."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(slots=True)
class RealRunResult:
    """What a measured run produced: its event log and how it went."""

    event_log: EventLog
    wall_time_s: float  # the run's span on its clock (0 = first send) until the last delivery
    num_rejected: int  # requests refused by the admission rule or shed by the policy
    reject_reasons: dict[str, str]  # req_id -> why it was refused
    scheduling_policy: dict[str, object] = field(default_factory=dict)  # policy_summary


def run_real(
    engine: RealEngine,
    workload: Workload,
    *,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
    run_clock: RunClock | None = None,
) -> RealRunResult:
    """Serve ``workload`` with ``engine`` in wall-clock time (or on ``run_clock``). The
    engine's policy should know the stream (``engine.stream``: ``stream_info``)."""
    warm_up(engine)
    core, log = engine.core, engine.core.event_log
    prompts = synthetic_prompts(workload, engine.model_config.vocab_size, seed)
    max_model_len = engine.engine_config.scheduler.max_model_len
    source = run_clock if run_clock is not None else WallClock()
    t0 = source.now()

    def clock() -> float:
        return source.now() - t0

    loop = EngineLoop(core, engine.executor, clock)
    processor = OutputProcessor(engine.tokenizer)
    limit = workload.max_concurrency
    n = len(workload)
    next_i, outstanding, done = 0, 0, 0
    rejects: dict[str, str] = {}
    params_cache: dict[int, SamplingParams] = {}
    while done < n:
        now = clock()
        while next_i < n and float(workload.send_time_s[next_i]) <= now and (
            limit is None or outstanding < limit
        ):
            i = next_i
            next_i += 1
            req_id = str(i)
            send_s = float(workload.send_time_s[i])
            if limit is not None:
                send_s = max(send_s, now)  # it waited for a slot: vllm bench times from here
            prompt, out_len = prompts[i], int(workload.output_lens[i])
            log.record(req_id, EventKind.ARRIVAL, send_s, len(prompt))
            slo = workload.slo_class(i)
            if workload.has_labels:
                log.record_labels(req_id, workload.tenant(i), "" if slo is None else slo.name)
            log.record(req_id, EventKind.FRONTEND_START, send_s)
            log.record(req_id, EventKind.TOKENIZED, send_s)
            reason = reject_reason(len(prompt), out_len, max_model_len)
            if reason is not None:
                rejects[req_id] = reason
                log.record(req_id, EventKind.REJECTED, clock(), reason)
                done += 1
                continue
            params = params_cache.get(out_len)
            if params is None:
                params = params_cache[out_len] = SamplingParams(
                    max_tokens=out_len, ignore_eos=True, temperature=0.0
                )
            request = engine.make_request(req_id, prompt, params, arrival_time=send_s,
                                          priority=int(workload.priorities[i]),
                                          tenant=workload.tenant(i), slo=slo)
            processor.add_request(req_id, None, prompt, params)
            core.add_request(request, clock())
            outstanding += 1
        if not loop.has_work():
            if core.held_by_policy and not (
                next_i < n and (limit is None or outstanding < limit)
            ):
                raise PolicyError(held_message(core))  # nothing more can arrive
            if next_i < n:
                wait = float(workload.send_time_s[next_i]) - clock()
                if wait > 0:
                    source.sleep(wait)
            continue
        outputs = loop.step()
        if not outputs:
            continue
        processed = processor.process_outputs(outputs)
        delivered_s = clock()
        if loop.applied_step_id is not None:
            log.record_delivery(loop.applied_step_id, delivered_s)
        for out in processed.finished:
            if out.req_id not in core.rejected_reasons:  # (a shed one was REJECTED)
                log.record(out.req_id, EventKind.DELIVERED, delivered_s)
            outstanding -= 1
            done += 1
            if progress is not None and done % 16 == 0:
                progress(done, n, delivered_s)
        if processed.reqs_to_abort:
            core.abort_requests(processed.reqs_to_abort, clock())
    rejects.update(core.rejected_reasons)
    policy = policy_summary(
        core.scheduler.policy, engine.engine_config.scheduler,
        "n/a (a real engine runs every step)",
    )
    return RealRunResult(log, clock(), len(rejects), rejects, policy)
