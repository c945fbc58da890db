"""An API server's side of the IPC: send requests to the EngineCore, turn its outputs into deltas.

Each API server binds two ZeroMQ sockets: a ROUTER the engines' DEALERs connect to (requests
and aborts go out on it, addressed to an engine's identity; each engine's ``EngineReady``
arrives on it once) and a PULL the engines' PUSHes connect to (outputs come in). With several
API servers every engine connects to every server's pair: many to many.

``AsyncEngineClient`` runs in the API server's event loop. Its output handler (one task, as
vLLM's) decodes each ``EngineOutputs`` message and, per request, detokenizes the new tokens,
checks stop strings (a match finishes the request here and aborts it in the engine), records
metrics, and puts a ``Delta`` into the request's ``OutputStream``. When the engine dies, every
stream fails with ``EngineDeadError`` and new requests are refused.

With several engines (``-dp N``) each request goes to the engine the router picks — the
simulator's routers (``engine/core/routing.py``), fed with this server's own requests in
flight per engine, every engine's running/waiting/KV usage as the DP coordinator last
published them (a SUB socket read by a second task), and, for ``prefix_aware``, this server's
index of the prompt blocks it sent to each engine (``prefix_index.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from engine.core.routing import ReplicaView, Router, make_router
from engine.core.sampling_params import SamplingParams
from engine.entrypoints.metrics import ServerMetrics
from engine.entrypoints.prefix_index import PrefixIndex
from engine.entrypoints.records import StageRecorder
from engine.entrypoints.stream import Delta, OutputStream, RequestText
from engine.entrypoints.wire import (
    AbortRequests,
    AddRequest,
    Codec,
    EngineDead,
    EngineInfo,
    EngineLoad,
    EngineOutputs,
    EngineReady,
    LoadSnapshot,
    engine_identity,
)

logger = logging.getLogger("twinserve.api")


class EngineDeadError(RuntimeError):
    """The EngineCore process is gone: in-flight requests are lost, new ones refused."""


@dataclass(slots=True)
class _Live:
    """A request the engine is running for this API server."""

    stream: OutputStream
    text: RequestText
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    engine_index: int
    first_token_s: float | None = None  # when its first tokens reached this API server
    last_token_s: float = 0.0


class AsyncEngineClient:
    """Requests out, outputs in, for one API server (``client_index``)."""

    def __init__(
        self,
        client_index: int,
        input_address: str,
        output_address: str,
        num_engines: int,
        clock: Callable[[], float],
        model_name: str,
        recorder: StageRecorder | None = None,
        coordinator_address: str | None = None,
        router: str = "vllm",
        router_load_cap: int = 8,
    ) -> None:
        self.client_index = client_index
        self.num_engines = num_engines
        self.router: Router | None = (
            make_router(router, router_load_cap) if num_engines > 1 else None)
        self.router_name = router
        self.loads = [EngineLoad(i, 0, 0, 0.0) for i in range(num_engines)]
        self.num_outstanding = [0] * num_engines  # this server's live requests per engine
        self.num_routed = [0] * num_engines  # requests this server sent to each engine
        self._prefixes: PrefixIndex | None = None
        self.clock = clock
        self.model_name = model_name
        self.recorder = recorder
        self.codec = Codec()
        self._ctx = zmq.asyncio.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.bind(input_address)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(output_address)
        self._sub: zmq.asyncio.Socket | None = None
        if coordinator_address is not None and num_engines > 1:
            self._sub = self._ctx.socket(zmq.SUB)
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.SUBSCRIBE, b"")
            self._sub.connect(coordinator_address)
        self._load_task: asyncio.Task[None] | None = None
        self._live: dict[str, _Live] = {}
        self._output_task: asyncio.Task[None] | None = None
        self.info: EngineInfo | None = None
        self.metrics: ServerMetrics | None = None  # engine 0's (the only one without DP)
        self.engine_metrics: list[ServerMetrics] = []
        self.dead_reason: str | None = None
        self._dead = asyncio.Event()

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @property
    def num_live(self) -> int:
        return len(self._live)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, stopping: Callable[[], bool] = lambda: False) -> EngineInfo:
        """Wait for every engine's handshake (an engine may take long to load its model;
        the wait ends early if the engine dies or ``stopping()`` turns true); start the output
        handler."""
        ready: set[bytes] = set()
        info: EngineInfo | None = None
        recv = asyncio.ensure_future(self._router.recv_multipart())
        dead = asyncio.ensure_future(self._dead.wait())
        try:
            while len(ready) < self.num_engines:
                done, _ = await asyncio.wait({recv, dead}, timeout=0.1,
                                             return_when=asyncio.FIRST_COMPLETED)
                if dead in done:
                    raise EngineDeadError(f"the engine died during startup: {self.dead_reason}")
                if stopping():
                    raise EngineDeadError("the server stopped before the engine was ready")
                if recv not in done:
                    continue
                identity, data = recv.result()
                recv = asyncio.ensure_future(self._router.recv_multipart())
                message = self.codec.decode_engine(data)
                if isinstance(message, EngineReady):
                    ready.add(identity)
                    info = message.info
        finally:
            recv.cancel()
            dead.cancel()
        assert info is not None
        self.info = info
        self.engine_metrics = [ServerMetrics(self.model_name, info.max_model_len, i)
                               for i in range(self.num_engines)]
        self.metrics = self.engine_metrics[0]
        if self.router_name == "prefix_aware" and self.num_engines > 1:
            self._prefixes = PrefixIndex(self.num_engines, info.block_size)
        self._output_task = asyncio.create_task(self._output_loop(), name="output-handler")
        if self._sub is not None:
            self._load_task = asyncio.create_task(self._load_loop(), name="dp-loads")
        return info

    async def close(self) -> None:
        for task in (self._output_task, self._load_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._router.close()
        self._pull.close()
        if self._sub is not None:
            self._sub.close()
        self._ctx.term()

    def mark_dead(self, reason: str) -> None:
        """The engine is gone: fail every request in flight, refuse new ones."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        self._dead.set()
        if self._output_task is None:
            return  # still starting: nothing in flight
        logger.error("API server %d: the engine is dead (%s); failing %d request(s)",
                     self.client_index, reason, len(self._live))
        error = EngineDeadError(f"the engine died: {reason}")
        for live in self._live.values():
            live.stream.fail(error)
        self._live.clear()

    # -- requests -------------------------------------------------------------------------------
    async def add(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        text: RequestText,
        arrival_s: float,
        priority: int = 0,
    ) -> OutputStream:
        """Send a request to the engine; its deltas arrive on the returned stream."""
        if self.dead_reason is not None:
            raise EngineDeadError(f"the engine died: {self.dead_reason}")
        engine_index = self._route(prompt_token_ids)
        stream = OutputStream()
        self._live[req_id] = _Live(stream, text, arrival_s, len(prompt_token_ids),
                                   params.max_tokens, engine_index)
        message = AddRequest(req_id, prompt_token_ids, params, arrival_s, self.client_index,
                             priority)
        await self._send(engine_index, self.codec.encode(message))
        return stream

    def _route(self, prompt_token_ids: list[int]) -> int:
        """The engine this request goes to (the only one without data parallelism)."""
        router = self.router
        if router is None:
            self.num_outstanding[0] += 1
            self.num_routed[0] += 1
            return 0
        prefixes = self._prefixes
        hashes = prefixes.block_hashes(prompt_token_ids) if prefixes is not None else []
        views = [
            ReplicaView(
                index=i, num_outstanding=self.num_outstanding[i],
                num_running=load.num_running, num_waiting=load.num_waiting,
                kv_usage=load.kv_cache_usage,
                cached_prefix_tokens=self._prefix_probe(i),
            )
            for i, load in enumerate(self.loads)
        ]
        chosen = router.choose(hashes, views)
        if prefixes is not None:
            prefixes.add(chosen, hashes)
        self.num_outstanding[chosen] += 1
        self.num_routed[chosen] += 1
        return chosen

    def _prefix_probe(self, engine: int) -> Callable[[list[int]], int]:
        """How many leading tokens of a prompt (its block hashes) ``engine`` has seen."""
        prefixes = self._prefixes
        if prefixes is None:
            return lambda hashes: 0

        def probe(hashes: list[int]) -> int:
            return prefixes.cached_tokens(engine, hashes)

        return probe

    def _done(self, live: _Live) -> None:
        self.num_outstanding[live.engine_index] -= 1

    async def _load_loop(self) -> None:
        """Keep the DP coordinator's latest snapshot of every engine's load."""
        assert self._sub is not None
        while True:
            message = self.codec.decode_engine(await self._sub.recv())
            if isinstance(message, LoadSnapshot) and len(message.loads) == self.num_engines:
                self.loads = list(message.loads)

    async def abort(self, req_id: str) -> None:
        """Stop a request (its client is gone); nothing if it already ended."""
        live = self._live.pop(req_id, None)
        if live is not None:
            self._done(live)
        if live is None or self.dead_reason is not None:
            return
        await self._send(live.engine_index, self.codec.encode(AbortRequests([req_id])))

    async def _send(self, engine_index: int, data: bytes) -> None:
        await self._router.send_multipart([engine_identity(engine_index), data])

    # -- outputs --------------------------------------------------------------------------------
    async def _output_loop(self) -> None:
        codec = self.codec
        while True:
            data = await self._pull.recv()
            try:
                message = codec.decode_engine(data)
                if isinstance(message, EngineOutputs):
                    to_abort = self._apply(message)
                    for engine_index, req_ids in to_abort.items():
                        await self._send(engine_index, codec.encode(AbortRequests(req_ids)))
                elif isinstance(message, EngineDead):
                    self.mark_dead(message.reason)
            except Exception as exc:  # a bug here must not leave clients hanging
                logger.exception("API server %d: output handler failed", self.client_index)
                self.mark_dead(f"output handler failed: {exc}")
                return

    def _apply(self, message: EngineOutputs) -> dict[int, list[str]]:
        """Hand each request its delta; returns requests a stop string ended (to abort)."""
        now = self.clock()
        metrics = self.engine_metrics[message.engine_index]
        to_abort: dict[int, list[str]] = {}
        for update in message.outputs:
            live = self._live.get(update.req_id)
            if live is None:
                continue  # aborted or stopped here while the engine still ran it
            reason, stop_reason = update.finish_reason, update.stop_reason
            text, stop = live.text.add(update.new_token_ids, reason is not None)
            if stop is not None:
                if reason is None:
                    to_abort.setdefault(live.engine_index, []).append(update.req_id)
                reason, stop_reason = "stop", stop
            num_new = len(update.new_token_ids)
            if num_new:
                ttft = itl = None
                if live.first_token_s is None:
                    live.first_token_s = now
                    ttft = now - live.arrival_s
                else:
                    itl = now - live.last_token_s
                live.last_token_s = now
                metrics.record_tokens(num_new, live.num_prompt_tokens, ttft, itl)
            live.stream.put(Delta(
                text, list(update.new_token_ids), [message.step_id] if num_new else [],
                message.engine_index, reason, stop_reason, update.error,
            ))
            if reason is None:
                continue
            del self._live[update.req_id]
            self._done(live)
            if update.error is None:
                first = None if live.first_token_s is None else live.first_token_s - live.arrival_s
                metrics.record_finished(
                    reason, live.num_prompt_tokens, live.text.num_output_tokens,
                    live.max_tokens, now - live.arrival_s, first, update.timing,
                )
        if message.stats is not None:
            metrics.record_stats(message.stats)
        if self.recorder is not None and message.step_id >= 0:
            self.recorder.processed(message.engine_index, message.step_id, self.clock())
        return to_abort
