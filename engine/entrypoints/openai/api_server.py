"""One API server: a FastAPI app on uvicorn, serving the OpenAI-compatible routes.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health`` (503 once the engine is dead), ``GET /version``, ``POST /tokenize``,
``POST /detokenize``, ``GET /metrics`` (Prometheus text format, every API server's metrics).

A pure-ASGI front door stamps each HTTP request's arrival time before anything else runs and,
with an API key set, answers 401 to ``/v1/*`` requests without ``Authorization: Bearer KEY``
(the other routes stay open, as in vLLM). Errors have OpenAI's body:
``{"error": {"message", "type", "param", "code"}}``; invalid parameters are 400.

The lifespan connects to the engines (``AsyncEngineClient.start``: every engine's handshake)
before uvicorn accepts a connection, and at shutdown writes the stage records.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from multiprocessing.connection import Connection
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.entrypoints.api_config import ENGINE_DEAD, READY, APIServerConfig
from engine.entrypoints.clock import run_clock
from engine.entrypoints.engine_client import AsyncEngineClient, EngineDeadError
from engine.entrypoints.metrics import render_metrics
from engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from engine.entrypoints.openai.serving import (
    ARRIVAL_SCOPE_KEY,
    APIError,
    OpenAIServing,
    error_response,
    json_response,
)
from engine.entrypoints.records import StageRecorder
from engine.serve.frontend import Tokenizer

logger = logging.getLogger("twinserve.api")

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowedError", 503: "ServiceUnavailableError"}


class FrontDoor:
    """ASGI middleware: arrival time of every HTTP request; the API key on ``/v1/*``."""

    def __init__(self, app: ASGIApp, clock: Any, api_key: str | None) -> None:
        self.app = app
        self.clock = clock
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[ARRIVAL_SCOPE_KEY] = self.clock()
            if self.expected is not None and scope["path"].startswith("/v1"):
                given = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(given, self.expected):
                    response = error_response(
                        401, "Unauthorized: give the server's API key as "
                        "'Authorization: Bearer KEY'", "AuthenticationError")
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class ServerControl:
    """The app's handle on the uvicorn server that runs it (set once the server exists)."""

    def __init__(self) -> None:
        self.server: uvicorn.Server | None = None

    def stopping(self) -> bool:
        return self.server is not None and self.server.should_exit

    def request_exit(self) -> None:
        if self.server is not None:
            self.server.should_exit = True


def build_app(cfg: APIServerConfig, lifeline: Connection, control: ServerControl) -> FastAPI:
    """The app (its server is told to exit, quietly, when the engine never becomes ready)."""
    clock = run_clock(cfg.clock_origin_s)
    tokenizer = Tokenizer.from_dir(cfg.tokenizer_dir) if cfg.tokenizer_dir else None
    recorder = StageRecorder(cfg.index, cfg.record_dir is not None, cfg.clock_origin_s)
    serving_ref: list[OpenAIServing] = []
    created = int(time.time())  # /v1/models' "created": when this server started

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = AsyncEngineClient(cfg.index, cfg.input_address, cfg.output_address,
                                   cfg.num_engines, clock, cfg.served_model_name, recorder,
                                   coordinator_address=cfg.coordinator_address,
                                   router=cfg.router, router_load_cap=cfg.router_load_cap)
        _watch_lifeline(lifeline, client, asyncio.get_running_loop())
        try:
            try:
                await client.start(control.stopping)
            except EngineDeadError:  # the launcher reports why; this server just stops
                control.request_exit()
                yield
                return
            serving = OpenAIServing(client, tokenizer, cfg.served_model_name, recorder, clock)
            serving.warm_up()
            serving_ref.append(serving)
            lifeline.send(READY)
            yield
        finally:
            await client.close()
            if cfg.record_dir is not None:
                recorder.write(cfg.record_dir)

    app = FastAPI(title="twinserve", lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.add_middleware(FrontDoor, clock=clock, api_key=cfg.api_key)

    def serving() -> OpenAIServing:
        if not serving_ref:
            raise APIError(503, "the server is not serving", "ServiceUnavailableError")
        return serving_ref[0]

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ())[1:])
            parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        return error_response(400, "; ".join(parts) or "invalid request", "BadRequestError")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        code = exc.status_code
        return error_response(code, str(exc.detail), ERROR_TYPES.get(code, "APIError"))

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.get("/health")
    async def health() -> Response:
        client = serving().client
        if client.is_dead:
            return error_response(503, f"the engine is dead: {client.dead_reason}",
                                  "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> Response:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as package_version

        try:
            number = package_version("twinserve")
        except PackageNotFoundError:
            number = "unknown"
        return json_response({"version": number})

    @app.get("/v1/models")
    async def models() -> Response:
        s = serving()
        card = ModelCard(cfg.served_model_name, created, cfg.model_root, s.max_model_len)
        return json_response(ModelList([card]))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await serving().completions(body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await serving().chat_completions(body, raw)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        s = serving()
        s.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages")
        if body.messages is not None:
            text = s.render_chat(body.messages, body.add_generation_prompt)
            ids = s.encode(text, bool(body.add_special_tokens))
        else:
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = s.encode(body.prompt or "", add)
        return json_response(TokenizeResponse(len(ids), s.max_model_len, ids))

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        s = serving()
        s.check_model(body.model)
        if s.tokenizer is None:
            raise APIError(400, "this model has no tokenizer", param="tokens")
        bad = next((t for t in body.tokens if not 0 <= t < s.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of vocabulary "
                           f"(vocab_size={s.vocab_size})", param="tokens")
        return json_response(DetokenizeResponse(s.tokenizer.decode(body.tokens)))

    @app.get("/metrics")
    async def metrics() -> Response:
        data, content_type = render_metrics()
        return Response(data, media_type=content_type)

    return app


def _watch_lifeline(lifeline: Connection, client: AsyncEngineClient,
                    loop: asyncio.AbstractEventLoop) -> None:
    """The launcher's news: the engine died (fail requests), or the launcher itself is gone
    (its end of the pipe closed: stop serving)."""

    def watch() -> None:
        try:
            while True:
                message = lifeline.recv()
                if isinstance(message, tuple) and message and message[0] == ENGINE_DEAD:
                    loop.call_soon_threadsafe(client.mark_dead, str(message[1]))
        except (EOFError, OSError):
            signal.raise_signal(signal.SIGTERM)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


class _Server(uvicorn.Server):
    """uvicorn's server, stopping on SIGTERM only (the launcher turns Ctrl-C into SIGTERM
    for each process in the right order)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self.handle_exit)
        yield


def serve(cfg: APIServerConfig, sock: socket.socket, lifeline: Connection) -> None:
    """Run the API server on the listening socket ``sock`` (shared by every API server)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    control = ServerControl()
    config = uvicorn.Config(
        build_app(cfg, lifeline, control), lifespan="on", loop="uvloop", http="httptools",
        log_level=cfg.log_level, access_log=False,
        timeout_graceful_shutdown=int(max(cfg.shutdown_timeout_s, 1)),
    )
    control.server = _Server(config)
    control.server.run(sockets=[sock])
