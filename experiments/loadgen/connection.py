"""A lean HTTP/1.1 client on asyncio streams: keep-alive connections that stream SSE bodies.

Why not aiohttp or httpx: on a small machine the load generator shares the CPU with the server
it measures, so its own cost per chunk is part of every latency it reports. This client does
only what a benchmark of an OpenAI-compatible server needs — ``POST`` a JSON body, read a
chunked (or sized) response, split Server-Sent Events into their ``data:`` payloads, ``GET`` a
JSON document — and timestamps every network read the moment it returns.

* ``ConnectionPool`` keeps idle keep-alive connections and opens a new one whenever none is
  idle (as vllm bench's aiohttp connector does without a limit; the benchmark's semaphore is
  what bounds concurrency);
* ``Connection.post_stream`` yields ``(receive_time_s, payload)`` for each SSE event whose
  payload is not ``[DONE]``; a non-200 answer raises ``HTTPStatusError`` with its body's
  message;
* ``get_json`` / ``post_json`` are one-shot requests on a fresh connection.

Times come from ``clock`` (``CLOCK_MONOTONIC``, the clock a ``twinserve serve`` run records
on), so a client and a server on one host share one time base.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


#: The client's clock: system-wide monotonic seconds.
def clock() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class HTTPStatusError(Exception):
    """A response other than 200 (``reason`` as vllm bench reports it, ``message`` from an
    OpenAI-style error body when there is one)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the server is: ``http(s)://host:port`` and a path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str  # path before the endpoint's own path ("" or e.g. "/api")

    @staticmethod
    def parse(base_url: str) -> Endpoint:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must look like http://HOST:PORT, got {base_url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return Endpoint(parts.scheme, parts.hostname, port, parts.path)


class Connection:
    """One keep-alive HTTP/1.1 connection (one request at a time)."""

    def __init__(self, endpoint: Endpoint, ssl_context: ssl.SSLContext | None) -> None:
        self.endpoint = endpoint
        self._ssl = ssl_context
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.reusable = True  # False once a response was not read to its end

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            e = self.endpoint
            self._reader, self._writer = await asyncio.open_connection(
                e.host, e.port, ssl=self._ssl)
        return self._reader, self._writer

    async def _send(self, method: str, path: str, body: bytes | None,
                    headers: Mapping[str, str]) -> tuple[asyncio.StreamReader, dict[str, str]]:
        reader, writer = await self._open()
        e = self.endpoint
        lines = [f"{method} {e.prefix}{path} HTTP/1.1", f"Host: {e.host}:{e.port}",
                 "Connection: keep-alive"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        fields = status_line.decode("latin-1").split(" ", 2)
        status, reason = int(fields[1]), fields[2].strip() if len(fields) > 2 else ""
        head: dict[str, str] = {":status": str(status), ":reason": reason}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            head[name.strip().lower()] = value.strip()
        if head.get("connection", "").lower() == "close":
            self.reusable = False
        return reader, head

    async def _body_parts(self, reader: asyncio.StreamReader,
                          head: Mapping[str, str]) -> AsyncIterator[bytes]:
        """The response body as it arrives (chunked, sized, or up to the connection's end)."""
        if head.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in head:
            left = int(head["content-length"])
            while left > 0:
                data = await reader.read(min(left, 1 << 16))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data
        else:
            self.reusable = False
            while data := await reader.read(1 << 16):
                yield data

    async def request_json(self, method: str, path: str, body: Any = None,
                           headers: Mapping[str, str] | None = None) -> Any:
        """One request with a JSON answer (raises ``HTTPStatusError`` unless 200)."""
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        reader, head = await self._send(method, path, data, hdrs)
        raw = b"".join([part async for part in self._body_parts(reader, head)])
        status = int(head[":status"])
        if status != 200:
            raise HTTPStatusError(status, head[":reason"], _error_message(raw))
        return json.loads(raw)

    async def post_stream(self, path: str, body: bytes,
                          headers: Mapping[str, str]) -> AsyncIterator[tuple[float, bytes]]:
        """POST ``body``; yield ``(receive time, data payload)`` per SSE event (``[DONE]`` and
        comments left out). Every network read is timestamped when it returns, before parsing,
        so the client's JSON decoding is not part of the times."""
        self.reusable = False  # until the body is read to its end
        reader, head = await self._send("POST", path, body, headers)
        status = int(head[":status"])
        if status != 200:
            raw = b"".join([part async for part in self._body_parts(reader, head)])
            self.reusable = head.get("connection", "").lower() != "close"
            raise HTTPStatusError(status, head[":reason"], _error_message(raw))
        buffer = b""
        async for part in self._body_parts(reader, head):
            now = clock()
            buffer += part
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue  # comments (":" pings), event names, blank lines
                    payload = line[5:].strip()
                    if payload and payload != b"[DONE]":
                        yield now, payload
        self.reusable = head.get("connection", "").lower() != "close"

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's text (shortened)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw[:200].decode("utf-8", "replace").strip()
    if isinstance(value, dict):
        err = value.get("error", value)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(value.get("detail"), str):
            return str(value["detail"])
    return raw[:200].decode("utf-8", "replace").strip()


class ConnectionPool:
    """Idle keep-alive connections to one endpoint; a new one whenever none is idle."""

    def __init__(self, endpoint: Endpoint, *, insecure: bool = False) -> None:
        self.endpoint = endpoint
        self._ssl: ssl.SSLContext | None = None
        if endpoint.scheme == "https":
            self._ssl = ssl.create_default_context()
            if insecure:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._idle: list[Connection] = []
        self.num_opened = 0

    def acquire(self) -> Connection:
        if self._idle:
            return self._idle.pop()
        self.num_opened += 1
        return Connection(self.endpoint, self._ssl)

    async def release(self, conn: Connection) -> None:
        if conn.reusable:
            self._idle.append(conn)
        else:
            await conn.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


async def get_json(endpoint: Endpoint, path: str, headers: Mapping[str, str] | None = None,
                   *, insecure: bool = False) -> Any:
    """``GET path`` on a fresh connection; the decoded JSON (``HTTPStatusError`` unless 200)."""
    pool = ConnectionPool(endpoint, insecure=insecure)
    conn = pool.acquire()
    try:
        return await conn.request_json("GET", path, headers=headers)
    finally:
        await conn.close()
