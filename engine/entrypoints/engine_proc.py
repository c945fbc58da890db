"""The EngineCore process: the core's busy loop behind ZeroMQ sockets (vLLM's ``EngineCoreProc``).

Layout, per engine, with N API servers (N ≥ 1):

* one ZMQ DEALER socket per API server, connected to that server's ROUTER: requests and aborts
  come in here, and the ``EngineReady`` handshake goes out once per connection;
* one ZMQ PUSH socket per API server, connected to that server's PULL: outputs go out here,
  each request's outputs to the API server that sent it.

Three threads, as in vLLM: an input thread receives and decodes messages from every DEALER
into a queue; an output thread encodes and sends; the main thread runs the busy loop — take
the queued inputs (blocking only when the engine has no work), add or abort requests, and run
one ``EngineLoop.step()`` (the same ``EngineCore`` + ``EngineLoop`` as every driver, async
batch queue included). Each applied step's outputs are grouped per API server into one
``EngineOutputs`` message; the scheduler's state and counters ride on exactly one of them.

What runs the model is not known here: an ``EngineFactory`` given by the layer that composes
the server builds it inside this process (a torch worker, or the emulated device of
``sim.emulation``). The process never imports torch itself.

Shutdown: SIGTERM (or the launcher's lifeline closing) ends the loop; the engine's event
records are written to the record file, if one was given; sockets close. SIGINT is ignored: the
launcher orders the shutdown (API servers first, so in-flight requests can finish).
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

import zmq

from engine.core.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.errors import UserError
from engine.core.events import EventLog
from engine.core.interfaces import Executor
from engine.core.outputs import EngineCoreOutput
from engine.core.policy import StreamInfo, policy_summary
from engine.core.process_name import set_process_name
from engine.core.request import Request, SamplingParams
from engine.entrypoints.clock import run_clock
from engine.entrypoints.engine_stats import EngineStatsTracker
from engine.entrypoints.records import EngineRecord, write_pickle
from engine.entrypoints.wire import (
    AbortRequests,
    AddRequest,
    ClientMessage,
    Codec,
    EngineDead,
    EngineInfo,
    EngineLoad,
    EngineMessage,
    EngineOutputs,
    EngineReady,
    RequestUpdate,
    engine_identity,
)
from engine.serve.engine_loop import EngineLoop, NonBlockingExecutor

logger = logging.getLogger("twinserve.engine")

#: Events kept in memory before an idle engine that records nothing starts a fresh log.
MAX_UNRECORDED_EVENTS = 1_000_000

#: What a served engine's scheduling policy knows of its requests: nothing in advance, and
#: they carry no SLO class (a policy that needs one is refused).
SERVED_STREAM = StreamInfo(has_slos=False)


class ServedEngine(Protocol):
    """An engine as the EngineCore process drives it (built in that process)."""

    engine_config: EngineConfig
    executor: Executor | NonBlockingExecutor
    vocab_size: int  # prompt token ids must be below this
    device: str  # where the model runs, in words

    def make_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
    ) -> Request: ...

    def shutdown(self) -> None: ...


class EngineFactory(Protocol):
    """Builds the engine inside the EngineCore process (picklable: it crosses the spawn)."""

    def build(self, clock: Callable[[], float], data_parallel_rank: int = 0) -> ServedEngine:
        """Load and warm up; ``clock`` is the run's clock (an emulated device sleeps on it);
        replica ``data_parallel_rank`` of a DP deployment takes the devices after the
        previous replicas' (``engine.core.parallel``'s rank order)."""
        ...


@dataclass(frozen=True, slots=True)
class EngineProcConfig:
    """Where one EngineCore process connects and what it records."""

    engine_index: int
    input_addresses: tuple[str, ...]  # one ROUTER per API server
    output_addresses: tuple[str, ...]  # one PULL per API server
    clock_origin_s: float  # the run's time 0 (engine.entrypoints.clock)
    record_path: str | None = None  # write the engine's event records here at shutdown
    coordinator_address: str | None = None  # the DP coordinator's PULL (DP > 1): loads go there


#: Output-queue destination of load reports: the DP coordinator's socket (the last one).
_COORDINATOR = -1


class _Shutdown:
    """Input-queue sentinel: stop the busy loop."""


_SHUTDOWN = _Shutdown()


class EngineCoreProc:
    """The busy loop and its sockets (one instance per EngineCore process)."""

    def __init__(self, cfg: EngineProcConfig, engine: ServedEngine,
                 clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.engine = engine
        self.clock = clock
        self.core = EngineCore(engine.engine_config, stream=SERVED_STREAM)
        self.loop = EngineLoop(self.core, engine.executor, clock)
        self.tracker = EngineStatsTracker(self.core.event_log)
        self.info = EngineInfo(
            max_model_len=engine.engine_config.scheduler.max_model_len,
            vocab_size=engine.vocab_size,
            num_gpu_blocks=engine.engine_config.cache.num_gpu_blocks,
            block_size=engine.engine_config.cache.block_size,
            device=engine.device,
        )
        self.inputs: queue.Queue[ClientMessage | _Shutdown] = queue.Queue()
        # (API server index, or _COORDINATOR, message); None stops the output thread
        self._outputs: queue.Queue[tuple[int, EngineMessage] | None] = queue.Queue()
        self._client_of: dict[str, int] = {}  # live request -> API server index
        self._last_load: EngineLoad | None = None  # last load sent to the DP coordinator
        self._received_s: dict[str, float] = {}  # input thread's receive times (recording)
        self._ctx = zmq.Context()
        self._stop_input = threading.Event()
        self._threads = [
            threading.Thread(target=self._input_thread, name="engine-input", daemon=True),
            threading.Thread(target=self._output_thread, name="engine-output", daemon=True),
        ]

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until shutdown; on an error, tell every API server the engine is dead."""
        for thread in self._threads:
            thread.start()
        try:
            self._busy_loop()
        except Exception as exc:
            logger.error("EngineCore %d failed:\n%s", self.cfg.engine_index,
                         traceback.format_exc())
            reason = f"{type(exc).__name__}: {exc}"
            for client in range(len(self.cfg.output_addresses)):
                self._outputs.put((client, EngineDead(self.cfg.engine_index, reason)))
            raise
        finally:
            self._close()

    def request_shutdown(self) -> None:
        self.inputs.put(_SHUTDOWN)

    def _close(self) -> None:
        self._stop_input.set()
        self._outputs.put(None)
        for thread in self._threads:
            thread.join(timeout=5)
        self._ctx.term()
        self.engine.shutdown()

    def write_records(self) -> None:
        if self.cfg.record_path is None:
            return
        record = EngineRecord(
            engine_index=self.cfg.engine_index,
            log=self.core.event_log.export(),
            max_model_len=self.info.max_model_len,
            num_gpu_blocks=self.info.num_gpu_blocks,
            device=self.info.device,
            received_s=dict(self._received_s),
            scheduling_policy=policy_summary(
                self.core.scheduler.policy, self.engine.engine_config.scheduler,
                "n/a (a served engine runs every step)",
            ),
        )
        write_pickle(Path(self.cfg.record_path), record)

    # -- the busy loop --------------------------------------------------------------------------
    def _busy_loop(self) -> None:
        loop = self.loop
        while True:
            if not self._take_inputs(block=not loop.has_work()):
                return
            if loop.has_work():
                outputs = loop.step()
                self._publish(outputs, loop.applied_step_id)
            else:
                self._publish([], None)
                self._maybe_fresh_log()

    def _take_inputs(self, block: bool) -> bool:
        """Apply the queued inputs (waiting for one if ``block``); False on shutdown."""
        inputs = self.inputs
        try:
            message = inputs.get() if block else inputs.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(message, _Shutdown):
                return False
            if isinstance(message, AddRequest):
                self._add(message)
            else:
                self._abort(message)
            try:
                message = inputs.get_nowait()
            except queue.Empty:
                return True

    def _add(self, message: AddRequest) -> None:
        req_id = message.req_id
        try:
            request = self.engine.make_request(
                req_id, message.prompt_token_ids, message.sampling_params,
                arrival_time=message.arrival_time_s, priority=message.priority,
            )
        except (UserError, ValueError) as exc:
            refusal = RequestUpdate(req_id, [], "error", error=str(exc))
            self._outputs.put((message.client_index, EngineOutputs(
                self.cfg.engine_index, -1, self.clock(), [refusal])))
            return
        self._client_of[req_id] = message.client_index
        self.tracker.add(req_id, len(message.prompt_token_ids))
        self.core.add_request(request, self.clock())

    def _abort(self, message: AbortRequests) -> None:
        self.core.abort_requests(message.req_ids, self.clock())
        for req_id in message.req_ids:
            self._client_of.pop(req_id, None)
            self.tracker.forget(req_id)

    def _publish(self, outputs: list[EngineCoreOutput], step_id: int | None) -> None:
        """Send each API server its requests' outputs, the stats with the first message."""
        tracker = self.tracker
        tracker.scan()
        now = self.clock()
        per_client: dict[int, list[RequestUpdate]] = {}
        for out in outputs:
            client = self._client_of.get(out.req_id)
            if client is None:
                continue  # aborted while its last batch was in flight
            tracker.count_tokens(out.req_id, len(out.new_token_ids))
            timing = None
            reason = None
            if out.finish_reason is not None:
                reason = str(out.finish_reason)
                timing = tracker.finish(out.req_id, now)
                del self._client_of[out.req_id]
            per_client.setdefault(client, []).append(
                RequestUpdate(out.req_id, out.new_token_ids, reason, out.stop_reason, timing)
            )
        scheduler = self.core.scheduler
        self._report_load()
        stats = tracker.stats(
            len(scheduler.running), len(scheduler.waiting), scheduler.kv_cache_manager.usage
        )
        if not per_client and stats is None:
            return
        if not per_client:
            per_client[0] = []
        sid = -1 if step_id is None else step_id
        index = self.cfg.engine_index
        for client, updates in per_client.items():
            self._outputs.put((client, EngineOutputs(index, sid, now, updates, stats)))
            stats = None

    def _report_load(self) -> None:
        """Tell the DP coordinator this engine's load when it changed (DP > 1 only)."""
        if self.cfg.coordinator_address is None:
            return
        scheduler = self.core.scheduler
        load = EngineLoad(self.cfg.engine_index, len(scheduler.running), len(scheduler.waiting),
                          round(scheduler.kv_cache_manager.usage, 4))
        if load != self._last_load:
            self._last_load = load
            self._outputs.put((_COORDINATOR, load))

    def _maybe_fresh_log(self) -> None:
        """An idle engine that records nothing starts a fresh event log once the old one is
        large (the core's records would otherwise grow with every request served)."""
        if self.cfg.record_path is not None or self.core.has_work():
            return
        log = self.core.event_log
        if len(log.events_columns()["kind"]) < MAX_UNRECORDED_EVENTS:  # type: ignore[arg-type]
            return
        fresh = EventLog()
        self.core.event_log = fresh
        self.tracker.use_log(fresh)

    # -- the IO threads -------------------------------------------------------------------------
    def _input_thread(self) -> None:
        codec = Codec()
        clock = self.clock
        received = self._received_s if self.cfg.record_path is not None else None
        identity = engine_identity(self.cfg.engine_index)
        sockets = []
        poller = zmq.Poller()
        ready = codec.encode(EngineReady(self.cfg.engine_index, self.info))
        for address in self.cfg.input_addresses:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            sock.send(ready)
            poller.register(sock, zmq.POLLIN)
            sockets.append(sock)
        try:
            while not self._stop_input.is_set():
                for sock, _ in poller.poll(timeout=100):
                    while True:
                        try:
                            data = sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        message = codec.decode_client(data)
                        if received is not None and isinstance(message, AddRequest):
                            received[message.req_id] = clock()
                        self.inputs.put(message)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in sockets:
                sock.close()

    def _output_thread(self) -> None:
        codec = Codec()
        sockets = []
        addresses = list(self.cfg.output_addresses)
        if self.cfg.coordinator_address is not None:
            addresses.append(self.cfg.coordinator_address)  # index _COORDINATOR (-1)
        for address in addresses:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)  # let the last outputs leave at shutdown
            sock.connect(address)
            sockets.append(sock)
        try:
            while True:
                item = self._outputs.get()
                if item is None:
                    return
                client, message = item
                sockets[client].send(codec.encode(message), copy=False)
        finally:
            for sock in sockets:
                sock.close()


def run_engine_core(
    cfg: EngineProcConfig, factory: EngineFactory, lifeline: Connection
) -> None:
    """Entry point of the EngineCore process."""
    set_process_name(f"EngineCore_DP{cfg.engine_index}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    clock = run_clock(cfg.clock_origin_s)
    stop = threading.Event()
    proc: list[EngineCoreProc] = []

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        if proc:
            proc[0].request_shutdown()

    signal.signal(signal.SIGTERM, on_term)
    _watch_lifeline(lifeline, on_term)
    try:
        engine = factory.build(clock, cfg.engine_index)
    except UserError as exc:  # e.g. a checkpoint that cannot be loaded: one line, no traceback
        print(f"twinserve: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    proc.append(EngineCoreProc(cfg, engine, clock))
    if stop.is_set():
        proc[0].request_shutdown()
    try:
        proc[0].run()
    finally:
        proc[0].write_records()


def _watch_lifeline(lifeline: Connection, on_close: Callable[[int, object], None]) -> None:
    """Shut down when the launcher's end of the lifeline closes (the launcher died)."""

    def watch() -> None:
        try:
            while True:
                lifeline.recv()
        except (EOFError, OSError):
            on_close(signal.SIGTERM, None)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
