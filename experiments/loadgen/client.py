"""Sending a benchmark's requests: vllm bench serve's client, on the lean connection pool.

``run_benchmark`` sends each ``BenchRequest`` at its send time (the workload's arrivals: vllm
bench's gamma process, a ramp-up, or a trace's own times), through a semaphore of
``max_concurrency`` when one is given, and measures each one as vllm bench's request functions
do (``RequestOutput``, vllm's ``RequestFuncOutput``):

* ``start_time`` when the request is sent (after the semaphore), ``client_queue_time`` the wait
  for the semaphore;
* ``ttft`` at the first SSE chunk with ``choices`` (a completion's ``text`` or a chat chunk's
  ``delta``), ``itl`` the gaps between such chunks, ``latency`` the last such chunk − start;
* ``output_tokens`` and ``prompt_len`` from the final usage chunk (``stream_options.
  include_usage``); ``success`` when at least one content chunk came and the stream ended
  without an error event;

plus what a run directory needs and vllm does not keep: every content chunk's receive time
(``chunk_times``) and the request's id. The payloads are vllm's: completions get ``prompt``,
``max_tokens``, ``repetition_penalty: 1.0``, ``logprobs``, ``stream``, ``stream_options``;
chat gets ``messages`` with one text part and ``max_completion_tokens``; both take
``ignore_eos`` and the extra body (sampling parameters, ``--extra-body``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from experiments.loadgen.connection import (
    ConnectionPool,
    Endpoint,
    HTTPStatusError,
    clock,
)
from experiments.loadgen.inputs import BenchRequest

#: Backends (vllm bench's names) and the API each one speaks.
BACKENDS: dict[str, str] = {"openai": "completions", "vllm": "completions",
                            "openai-chat": "chat"}


@dataclass(slots=True)
class RequestOutput:
    """One request as the client saw it (vllm's ``RequestFuncOutput``; seconds on ``clock``)."""

    request_id: str
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    tpot: float = 0.0
    prompt_len: int = 0
    error: str = ""
    start_time: float = 0.0
    client_queue_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # receive time of each content chunk
    #: cumulative completion tokens at each content chunk (continuous usage stats; else empty)
    chunk_completion_tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # of the last content chunk


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What every request of a benchmark shares."""

    endpoint: Endpoint
    api_path: str  # e.g. /v1/completions
    api: str  # "completions" or "chat"
    model: str | None  # the name sent as "model" (None: none sent, the server's only one)
    ignore_eos: bool = False
    logprobs: int | None = None
    continuous_usage: bool = False  # ask for usage on every chunk (tokens per chunk, exactly)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    extra_headers: Mapping[str, str] = field(default_factory=dict)

    def payload(self, request: BenchRequest) -> dict[str, Any]:
        stream_options: dict[str, bool] = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        if self.api == "chat":
            body: dict[str, Any] = {
                "model": self.model,
                "messages": [{"role": "user",
                              "content": [{"type": "text", "text": request.prompt}]}],
                "max_completion_tokens": request.output_len,
                "stream": True, "stream_options": stream_options,
            }
        else:
            body = {"model": self.model, "prompt": request.prompt, "repetition_penalty": 1.0,
                    "max_tokens": request.output_len, "logprobs": self.logprobs,
                    "stream": True, "stream_options": stream_options}
        if self.model is None:
            del body["model"]
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra_body)
        return body

    def headers(self, request_id: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get("OPENAI_API_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        headers.update(self.extra_headers)
        if request_id is not None:
            headers["x-request-id"] = request_id
        return headers


async def send_one(pool: ConnectionPool, spec: RequestSpec, request: BenchRequest,
                   request_id: str | None) -> RequestOutput:
    """Send one streaming request and measure it (see the module docstring)."""
    out = RequestOutput(request_id or "", prompt_len=request.prompt_len)
    body = json.dumps(spec.payload(request)).encode()
    conn = pool.acquire()
    text: list[str] = []
    st = clock()
    out.start_time = st
    last = st
    try:
        async for now, payload in conn.post_stream(spec.api_path, body, spec.headers(request_id)):
            data = json.loads(payload)
            choices = data.get("choices")
            if choices:
                choice = choices[0]
                piece = (choice.get("delta") or {}).get("content") if spec.api == "chat" \
                    else choice.get("text")
                if not out.chunk_times:
                    out.ttft = now - st
                else:
                    out.itl.append(now - last)
                out.chunk_times.append(now)
                last = now
                text.append(piece or "")
                if (usage := data.get("usage")) and usage.get("completion_tokens") is not None:
                    out.chunk_completion_tokens.append(int(usage["completion_tokens"]))
                if choice.get("finish_reason") is not None:
                    out.finish_reason = choice["finish_reason"]
            elif usage := data.get("usage"):
                out.output_tokens = int(usage.get("completion_tokens") or 0)
                if usage.get("prompt_tokens") is not None:
                    out.prompt_len = int(usage["prompt_tokens"])
            elif "error" in data:
                err = data["error"]
                out.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        if out.error:
            out.success = False
        elif out.chunk_times:
            out.success = True
        else:
            out.error = ("Never received a valid chunk to calculate TTFT.This response will be "
                         "marked as failed!")
        out.generated_text = "".join(text)
        out.latency = last - st
    except HTTPStatusError as exc:
        out.error = exc.reason + (f": {exc.message}" if exc.message else "")
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        conn.reusable = False
    finally:
        await pool.release(conn)
    return out


@dataclass(frozen=True, slots=True)
class BenchRun:
    """A finished benchmark: its outputs in send order and its clock readings."""

    outputs: list[RequestOutput]
    start_s: float  # clock() when the first send was due (vllm's benchmark_start_time)
    end_s: float  # clock() when the last request finished
    warmup_outputs: list[RequestOutput]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


async def _run(spec: RequestSpec, requests: Sequence[BenchRequest], *,
               max_concurrency: int | None, num_warmups: int,
               progress: Callable[[int, int], None] | None, insecure: bool) -> BenchRun:
    pool = ConnectionPool(spec.endpoint, insecure=insecure)
    warmups: list[RequestOutput] = []
    try:
        if num_warmups > 0:
            gate = asyncio.Semaphore(max_concurrency or num_warmups)

            async def warm() -> RequestOutput:
                async with gate:
                    return await send_one(pool, spec, requests[0], None)

            warmups = list(await asyncio.gather(*(warm() for _ in range(num_warmups))))
        semaphore: Any = (asyncio.Semaphore(max_concurrency) if max_concurrency
                          else contextlib.nullcontext())
        done = [0]

        async def limited(request: BenchRequest, arrival: float) -> RequestOutput:
            async with semaphore:
                out = await send_one(pool, spec, request, request.request_id)
            out.client_queue_time = out.start_time - arrival
            done[0] += 1
            if progress is not None:
                progress(done[0], len(requests))
            return out

        start = clock()
        tasks = []
        for request in requests:
            delay = start + request.send_time_s - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(limited(request, clock())))
        outputs = list(await asyncio.gather(*tasks))
        end = clock()
    finally:
        await pool.close()
    return BenchRun(outputs, start, end, warmups)


def run_benchmark(spec: RequestSpec, requests: Sequence[BenchRequest], *,
                  max_concurrency: int | None = None, num_warmups: int = 0,
                  progress: Callable[[int, int], None] | None = None,
                  insecure: bool = False) -> BenchRun:
    """Send ``requests`` at their send times; their outputs in send order."""
    return asyncio.run(_run(spec, requests, max_concurrency=max_concurrency,
                            num_warmups=num_warmups, progress=progress, insecure=insecure))


class ProgressLine:
    """``done/total requests`` on stderr, refreshed a few times a second (vllm bench shows a
    tqdm bar; ``--disable-tqdm`` turns this off)."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = clock()
        if done < total and now - self._last < 0.25:
            return
        self._last = now
        sys.stderr.write(f"\r{done}/{total} requests")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
