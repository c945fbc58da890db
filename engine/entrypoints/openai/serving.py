"""The generation endpoints: ``/v1/completions`` and ``/v1/chat/completions``.

One request's path through an API server, with the stage it records:

1. the HTTP request is received (``ARRIVAL``, stamped by the front-door middleware before the
   body is read) and its handler starts (``FRONTEND_START``);
2. validation, chat template and tokenization (a refusal is a 4xx with an OpenAI error body
   and ``REJECTED``); the request goes to the engine (``TOKENIZED``);
3. its deltas come back through its ``OutputStream`` and are written to the client — as one
   JSON response, or as Server-Sent Events (``data: {...}`` lines, an optional usage chunk,
   ``data: [DONE]``); the steps whose tokens a write carried are recorded as delivered at its
   end, and the last token's write is the request's ``DELIVERED``.

A client that goes away mid-request has its request aborted in the engine (its KV blocks are
freed); a dead engine ends every request in flight with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.core.events import EventKind
from engine.core.sampling_params import SamplingParams
from engine.entrypoints.engine_client import AsyncEngineClient, EngineDeadError
from engine.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatStreamChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    UsageInfo,
    unsupported,
)
from engine.entrypoints.records import StageRecorder
from engine.entrypoints.stream import Delta, OutputStream, RequestText
from engine.serve.frontend import Tokenizer, TokenizerError

#: Key of the arrival time the front-door middleware puts into each HTTP request's scope.
ARRIVAL_SCOPE_KEY = "twinserve.arrival_s"
#: max_tokens of a completion that gives none (OpenAI's default).
DEFAULT_COMPLETION_MAX_TOKENS = 16

_json = msgspec.json.Encoder()


class APIError(Exception):
    """A request refused with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param

    def response(self) -> Response:
        return error_response(self.status, self.message, self.type, self.param)


def error_response(status: int, message: str, type_: str, param: str | None = None) -> Response:
    body = ErrorResponse(ErrorInfo(message, type_, param, status))
    return Response(_json.encode(body), status_code=status, media_type="application/json")


def json_response(value: Any) -> Response:
    return Response(_json.encode(value), media_type="application/json")


class SSEResponse(StreamingResponse):
    """A Server-Sent Events stream that calls ``on_close`` however it ends (finished, client
    gone, server shutting down)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A validated request, ready for the engine."""

    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool


class OpenAIServing:
    """The state the endpoints share inside one API server process."""

    def __init__(
        self,
        client: AsyncEngineClient,
        tokenizer: Tokenizer | None,
        model_name: str,
        recorder: StageRecorder,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.recorder = recorder
        self.clock = clock
        self._seq = itertools.count()
        self._aborts: set[asyncio.Task[None]] = set()

    @property
    def max_model_len(self) -> int:
        assert self.client.info is not None
        return self.client.info.max_model_len

    @property
    def vocab_size(self) -> int:
        assert self.client.info is not None
        return self.client.info.vocab_size

    # -- endpoints ------------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, raw: Request) -> Response:
        return await self._generate(body, raw, _CompletionFormat(), self._completion_prompt)

    async def chat_completions(self, body: ChatCompletionRequest, raw: Request) -> Response:
        return await self._generate(body, raw, _ChatFormat(), self._chat_prompt)

    # -- the shared path ------------------------------------------------------------------------
    async def _generate(
        self,
        body: CompletionRequest | ChatCompletionRequest,
        raw: Request,
        fmt: _Format,
        prompt_of: Callable[[Any], list[int]],
    ) -> Response:
        clock, recorder = self.clock, self.recorder
        arrival = float(raw.scope.get(ARRIVAL_SCOPE_KEY, clock()))
        start = clock()
        req_id = f"{self.client.client_index}-{next(self._seq)}"
        external = raw.headers.get("x-request-id") or uuid.uuid4().hex
        recorder.external_id(req_id, external)
        prompt_ids: list[int] = []
        try:
            self.check_model(body.model)
            refused = unsupported(body)
            if refused is not None:
                raise APIError(400, f"{refused[0]}: {refused[1]}", param=refused[0])
            prompt_ids = prompt_of(body)
            prepared = self._prepare(body, prompt_ids)
        except APIError as exc:
            recorder.event(req_id, EventKind.ARRIVAL, arrival, len(prompt_ids))
            recorder.event(req_id, EventKind.FRONTEND_START, start)
            recorder.event(req_id, EventKind.REJECTED, clock(), exc.message)
            return exc.response()
        recorder.event(req_id, EventKind.ARRIVAL, arrival, len(prompt_ids))
        recorder.event(req_id, EventKind.FRONTEND_START, start)
        text = RequestText(self.tokenizer, prompt_ids, prepared.params, body.skip_special_tokens)
        recorder.event(req_id, EventKind.TOKENIZED, clock())
        try:
            stream = await self.client.add(
                req_id, prompt_ids, prepared.params, text, arrival, body.priority
            )
        except EngineDeadError as exc:
            return error_response(503, str(exc), "ServiceUnavailableError")
        call = _Call(self, req_id, f"{fmt.id_prefix}-{external}", int(time.time()),
                     len(prompt_ids), fmt, prepared)
        if prepared.stream:
            return SSEResponse(call.events(stream), call.close)
        return await call.respond(stream, raw)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                           f"`{self.model_name}`.", "NotFoundError", "model")

    def _completion_prompt(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.encode(prompt, body.add_special_tokens)
        return [int(t) for t in prompt]  # type: ignore[arg-type]

    def _chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        text = self.render_chat(body.messages, body.add_generation_prompt)
        return self.encode(text, False)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send the prompt as token ids",
                           param="prompt")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer, so no chat template",
                           param="messages")
        conversation = []
        for i, message in enumerate(messages):
            content = message.content
            if isinstance(content, list):
                parts = []
                for part in content:
                    if part.type != "text" or part.text is None:
                        raise APIError(400, f"messages[{i}]: only text content parts are "
                                       f"supported, got {part.type!r}", param="messages")
                    parts.append(part.text)
                content = "\n".join(parts)
            conversation.append({"role": message.role, "content": content or ""})
        try:
            return self.tokenizer.apply_chat_template(conversation, add_generation_prompt)
        except TokenizerError as exc:
            raise APIError(400, str(exc), param="messages") from None

    def _prepare(self, body: CompletionRequest | ChatCompletionRequest,
                 prompt_ids: list[int]) -> _Prepared:
        """Validate the prompt against the model and build the sampling parameters."""
        n, limit = len(prompt_ids), self.max_model_len
        if n == 0:
            raise APIError(400, "the prompt is empty: it must hold at least one token",
                           param="prompt")
        if n > limit:
            raise APIError(
                400, f"This model's maximum context length is {limit} tokens, but the prompt "
                f"has {n} tokens: {n - limit} too many.", param="prompt")
        bad = next((t for t in prompt_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of vocabulary "
                           f"(vocab_size={self.vocab_size})", param="prompt")
        if isinstance(body, ChatCompletionRequest):
            max_tokens = body.max_completion_tokens or body.max_tokens
            name = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            if max_tokens is None:
                max_tokens = limit - n
        else:
            max_tokens, name = body.max_tokens, "max_tokens"
            if max_tokens is None:
                max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
        if max_tokens < 1:
            raise APIError(400, f"{name} must be at least 1, got {max_tokens}", param=name)
        if n + max_tokens > limit:
            raise APIError(
                400, f"This model's maximum context length is {limit} tokens, but the prompt "
                f"({n} tokens) plus {name} ({max_tokens}) is {n + max_tokens}: "
                f"{n + max_tokens - limit} too many. Shorten the prompt or lower {name}.",
                param=name)
        stop = body.stop if isinstance(body.stop, list) else [body.stop] if body.stop else []
        if stop and self.tokenizer is None:
            raise APIError(400, "stop strings need a tokenizer; this model has none",
                           param="stop")
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                min_tokens=body.min_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_k=0 if body.top_k is None else body.top_k,
                top_p=1.0 if body.top_p is None else body.top_p,
                seed=body.seed,
                stop_token_ids=tuple(body.stop_token_ids or ()),
                stop=tuple(stop),
                ignore_eos=body.ignore_eos,
            )
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        options = body.stream_options
        include_usage = bool(body.stream) and options is not None and bool(options.include_usage)
        continuous = include_usage and bool(options and options.continuous_usage_stats)
        return _Prepared(prompt_ids, params, bool(body.stream), include_usage, continuous)

    def warm_up(self) -> None:
        """Pay the first-use costs (jinja import and template compilation, the tokenizer's
        first calls) before the first request does."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            return
        tokenizer.decode(tokenizer.encode("Hello world"))
        if tokenizer.chat_template is not None:
            # a template that refuses a lone user turn still got compiled
            with contextlib.suppress(TokenizerError):
                tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])

    def abort_soon(self, req_id: str) -> None:
        """Abort a request from a synchronous context (a response closing)."""
        task = asyncio.ensure_future(self.client.abort(req_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


class _Call:
    """One generation request being answered."""

    def __init__(self, serving: OpenAIServing, req_id: str, response_id: str, created: int,
                 num_prompt_tokens: int, fmt: _Format, prepared: _Prepared) -> None:
        self.serving = serving
        self.req_id = req_id
        self.response_id = response_id
        self.created = created
        self.num_prompt_tokens = num_prompt_tokens
        self.fmt = fmt
        self.prepared = prepared
        self.finished = False

    def usage(self, num_output_tokens: int) -> UsageInfo:
        n = self.num_prompt_tokens
        return UsageInfo(n, num_output_tokens, n + num_output_tokens)

    def close(self) -> None:
        """The response is over: a request still running (client gone) is aborted."""
        if not self.finished:
            self.finished = True
            self.serving.abort_soon(self.req_id)

    def _delivered(self, delta: Delta) -> None:
        s = self.serving
        now = s.clock()
        s.recorder.delivered(delta.engine_index, delta.step_ids, now)
        if delta.finished:
            self.finished = True
            s.recorder.event(self.req_id, EventKind.DELIVERED, now)

    async def respond(self, stream: OutputStream, raw: Request) -> Response:
        """The non-streaming answer; a client that disconnects first aborts the request."""
        final = asyncio.ensure_future(stream.get_final())
        gone = asyncio.ensure_future(_disconnected(raw))
        try:
            await asyncio.wait({final, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not final.done():
                final.cancel()
                self.close()
        if not final.done():
            return Response(status_code=499)
        try:
            delta = final.result()
        except EngineDeadError as exc:
            self.finished = True
            return error_response(500, str(exc), "InternalServerError")
        if delta.error is not None:
            self.finished = True
            return error_response(400, delta.error, "BadRequestError")
        body = self.fmt.response(self, delta, self.usage(len(delta.token_ids)))
        self._delivered(delta)
        return json_response(body)

    async def events(self, stream: OutputStream) -> AsyncIterator[bytes]:
        """The Server-Sent Events of a streaming answer."""
        fmt, prepared = self.fmt, self.prepared
        num_output = 0
        first = True
        try:
            while True:
                delta = await stream.get()
                if delta.error is not None:
                    self.finished = True
                    yield _sse(ErrorResponse(ErrorInfo(delta.error, "BadRequestError")))
                    break
                num_output += len(delta.token_ids)
                usage = self.usage(num_output) if prepared.continuous_usage else None
                for chunk in fmt.chunks(self, delta, first, usage):
                    yield _sse(chunk)
                first = False
                self._delivered(delta)
                if delta.finished:
                    break
            if prepared.include_usage and delta.error is None:
                yield _sse(fmt.usage_chunk(self, self.usage(num_output)))
        except EngineDeadError as exc:
            self.finished = True
            yield _sse(ErrorResponse(ErrorInfo(str(exc), "InternalServerError", code=500)))
        yield b"data: [DONE]\n\n"


def _sse(value: Any) -> bytes:
    return b"data: " + _json.encode(value) + b"\n\n"


async def _disconnected(raw: Request) -> None:
    """Returns when the client has closed its connection."""
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


class _Format(Protocol):
    """How one endpoint words its answers."""

    id_prefix: str

    def response(self, call: _Call, delta: Delta, usage: UsageInfo) -> object: ...

    def chunks(self, call: _Call, delta: Delta, first: bool, usage: UsageInfo | None
               ) -> list[object]: ...

    def usage_chunk(self, call: _Call, usage: UsageInfo) -> object: ...


class _CompletionFormat:
    id_prefix = "cmpl"

    def response(self, call: _Call, delta: Delta, usage: UsageInfo) -> CompletionResponse:
        choice = CompletionChoice(0, delta.text, delta.finish_reason, delta.stop_reason)
        return CompletionResponse(call.response_id, call.created, call.serving.model_name,
                                  [choice], usage)

    def chunks(self, call: _Call, delta: Delta, first: bool, usage: UsageInfo | None
               ) -> list[object]:
        choice = CompletionChoice(0, delta.text, delta.finish_reason, delta.stop_reason)
        return [CompletionChunk(call.response_id, call.created, call.serving.model_name,
                                [choice], usage)]

    def usage_chunk(self, call: _Call, usage: UsageInfo) -> CompletionChunk:
        return CompletionChunk(call.response_id, call.created, call.serving.model_name, [],
                               usage)


class _ChatFormat:
    id_prefix = "chatcmpl"

    def response(self, call: _Call, delta: Delta, usage: UsageInfo) -> ChatCompletionResponse:
        choice = ChatChoice(0, AssistantMessage(delta.text), delta.finish_reason,
                            delta.stop_reason)
        return ChatCompletionResponse(call.response_id, call.created, call.serving.model_name,
                                      [choice], usage)

    def chunks(self, call: _Call, delta: Delta, first: bool, usage: UsageInfo | None
               ) -> list[object]:
        name = call.serving.model_name
        out: list[object] = []
        if first:  # the role comes with the first output, as vLLM sends it
            role = ChatStreamChoice(0, DeltaMessage(role="assistant", content=""))
            out.append(ChatCompletionChunk(call.response_id, call.created, name, [role], usage))
        choice = ChatStreamChoice(0, DeltaMessage(content=delta.text), delta.finish_reason,
                                  delta.stop_reason)
        out.append(ChatCompletionChunk(call.response_id, call.created, name, [choice], usage))
        return out

    def usage_chunk(self, call: _Call, usage: UsageInfo) -> ChatCompletionChunk:
        return ChatCompletionChunk(call.response_id, call.created, call.serving.model_name, [],
                                   usage)
