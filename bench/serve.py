"""Benchmark: what the serving path itself adds — HTTP, IPC, the engine loop, the output path.

Starts ``twinserve serve --emulate --cost-model zero`` (an emulated device whose steps take no
time), then one whose steps take 10 ms, so what a client measures beyond the steps belongs to
the server: the API server (FastAPI, validation, output processing, SSE), the ZeroMQ hops and
the EngineCore's busy loop. For each concurrency C a fresh server is driven by C streaming
clients sending requests back to back (closed loop); the client-side TTFT and inter-token
latency are reported (median and p99) as ``vllm bench serve`` measures them, beside the
server's own request-path segments from its run directory (in: HTTP request received -> in the
engine's queue; out: first token applied -> written to the client). Then the requests/s one
API server sustains: 64 clients, one output token per request.

The small load client here (``replay``, ``closed_loop``) streams completions over keep-alive
HTTP/1.1 connections with asyncio streams (lean, because on a small machine the client shares
the CPU with the server) and times chunks as vllm bench's client does (TTFT: the first chunk
with choices; ITL: between chunks with choices).

Usage: python -m bench.serve [--concurrency 1,16,64] [--requests-per-client 20]
       [--prompt-len 128] [--output-len 32] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


@dataclass(slots=True)
class ClientRecord:
    """One request as its client saw it (seconds, on the client's clock)."""

    start_s: float
    ttft_s: float = float("nan")
    itls_s: list[float] = field(default_factory=list)
    latency_s: float = float("nan")
    num_chunks: int = 0
    completion_tokens: int = 0
    error: str | None = None


class _Connection:
    """One keep-alive HTTP/1.1 connection that streams completions (a lean client: on a
    small machine the client shares the CPU with the server, and the openai SDK's parsing
    would be measured as the server's latency)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> asyncio.StreamReader:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status = await self.reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(status.decode().strip())
        while (await self.reader.readline()) not in (b"\r\n", b""):
            pass  # headers (the body is chunked)
        return self.reader

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _events(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a chunked Server-Sent Events body, up to ``[DONE]``."""
    buffer = b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return
        buffer += data[:-2]
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            payload = event.removeprefix(b"data: ")
            if payload == b"[DONE]":
                continue
            yield payload


async def _one(conn: _Connection, prompt: list[int], max_tokens: int,
               t0: float) -> ClientRecord:
    start = time.perf_counter()
    rec = ClientRecord(start - t0)
    last = start
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0.0, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}).encode()
    try:
        reader = await conn.post("/v1/completions", body)
        async for payload in _events(reader):
            now = time.perf_counter()
            chunk = json.loads(payload)
            if chunk.get("choices"):
                if rec.num_chunks == 0:
                    rec.ttft_s = now - start
                else:
                    rec.itls_s.append(now - last)
                rec.num_chunks += 1
                last = now
            elif chunk.get("usage"):
                rec.completion_tokens = chunk["usage"]["completion_tokens"]
            elif "error" in chunk:
                rec.error = str(chunk["error"])
        rec.latency_s = last - start
    except (OSError, RuntimeError, ValueError, asyncio.IncompleteReadError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        await conn.close()
        conn.writer = None
    return rec


def _address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def replay(base_url: str, prompts: Sequence[list[int]], max_tokens: Sequence[int],
           send_times_s: Sequence[float]) -> list[ClientRecord]:
    """Send request i at ``send_times_s[i]`` (open loop, one connection each); one record per
    request, in order."""
    host, port = _address(base_url)

    async def run() -> list[ClientRecord]:
        t0 = time.perf_counter()

        async def at(i: int) -> ClientRecord:
            delay = send_times_s[i] - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            conn = _Connection(host, port)
            try:
                return await _one(conn, prompts[i], max_tokens[i], t0)
            finally:
                await conn.close()

        return list(await asyncio.gather(*(at(i) for i in range(len(prompts)))))

    return asyncio.run(run())


def closed_loop(base_url: str, concurrency: int, requests_per_client: int, prompt_len: int,
                output_len: int) -> tuple[list[ClientRecord], float]:
    """``concurrency`` clients, each sending requests back to back on its own keep-alive
    connection; (records, wall seconds)."""
    host, port = _address(base_url)

    async def run() -> tuple[list[ClientRecord], float]:
        t0 = time.perf_counter()

        async def worker(w: int) -> list[ClientRecord]:
            conn = _Connection(host, port)
            out = []
            try:
                for k in range(requests_per_client):
                    prompt = [100 + (w * 7919 + k * 31 + j) % 5000 for j in range(prompt_len)]
                    out.append(await _one(conn, prompt, output_len, t0))
            finally:
                await conn.close()
            return out

        nested = await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return [r for rs in nested for r in rs], time.perf_counter() - t0

    return asyncio.run(run())


@dataclass(frozen=True, slots=True)
class Row:
    concurrency: int
    requests: int
    errors: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    requests_per_s: float
    chunks_per_request: float
    in_path_p50_ms: float = float("nan")  # server: HTTP received -> in the engine's queue
    out_path_p50_ms: float = float("nan")  # server: first token applied -> written to client


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(concurrency: int, records: list[ClientRecord], wall_s: float,
              run_dir: Path | None = None) -> Row:
    """Client-side figures, and the server's own request-path segments from its run
    directory (``twinserve serve --record-dir``), if given."""
    ok = [r for r in records if r.error is None]
    ttfts = [r.ttft_s * 1000 for r in ok]
    itls = [x * 1000 for r in ok for x in r.itls_s]
    in_path = out_path = float("nan")
    if run_dir is not None:
        import pandas as pd

        req = pd.read_parquet(run_dir / "requests.parquet")
        in_path = float((req["engine_enqueued_s"] - req["arrival_s"]).median()) * 1000
        out_path = float(req["seg_output_first_s"].median()) * 1000
    return Row(
        concurrency, len(records), len(records) - len(ok),
        _percentile(ttfts, 50), _percentile(ttfts, 99),
        _percentile(itls, 50), _percentile(itls, 99),
        len(ok) / wall_s, statistics.fmean(r.num_chunks for r in ok) if ok else 0.0,
        in_path, out_path,
    )


class EmulatedServer:
    """``twinserve serve --emulate`` in a subprocess on a free port."""

    def __init__(self, *flags: str) -> None:
        cmd = [sys.executable, "-m", "experiments.cli", "serve", "--emulate", "--port", "0",
               *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                if " on http://" in line and not self.url:
                    self.url = line.split(" on ", 1)[1].split()[0]
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or not self.url:
            self.proc.kill()
            raise RuntimeError("the emulated server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def measure(model: str, step_ms: float, concurrency: int, per_client: int, prompt_len: int,
            output_len: int, api_server_count: int) -> Row:
    """A fresh emulated server whose steps take ``step_ms``, driven by ``concurrency``
    closed-loop streaming clients; its run directory gives the server-side segments."""
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        run_dir = Path(tmp) / "run"
        server = EmulatedServer("--model", model, "--cost-model", f"fixed:{step_ms / 1000}",
                                "--api-server-count", str(api_server_count),
                                "--record-dir", str(run_dir), "--no-plots")
        base = server.url + "/v1"
        try:
            closed_loop(base, 1, 2, prompt_len, 2)  # warm-up (its 2 requests are recorded)
            records, wall = closed_loop(base, concurrency, per_client, prompt_len, output_len)
        finally:
            server.stop()
        return summarize(concurrency, records, wall, run_dir)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--requests-per-client", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--step-ms", default="0,10",
                   help="emulated step times to measure with (0: zero-cost; default 0,10)")
    p.add_argument("--throughput-requests", type=int, default=10,
                   help="requests per client of the requests/s run (64 clients, 1 token each)")
    p.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    p.add_argument("--api-server-count", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--smoke", action="store_true", help="tiny run (the test suite's check)")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    steps = [float(x) for x in args.step_ms.split(",")]
    per_client, tput_requests, tput_clients = args.requests_per_client, args.throughput_requests, 64
    if args.smoke:
        levels, steps, per_client, tput_requests, tput_clients = [1, 4], [0.0], 2, 1, 4
    for step_ms in steps:
        rows = [measure(args.model, step_ms, c, per_client, args.prompt_len, args.output_len,
                        args.api_server_count) for c in levels]
        tput = measure(args.model, step_ms, tput_clients, tput_requests, args.prompt_len, 1,
                       args.api_server_count)
        if args.json:
            for row in [*rows, tput]:
                print(json.dumps({"step_ms": step_ms,
                                  **{f: getattr(row, f) for f in row.__dataclass_fields__}}))
            continue
        print(f"emulated {args.model}, every step {step_ms:g} ms; prompt {args.prompt_len} "
              f"tokens, {args.output_len} output tokens; {args.api_server_count} API server(s)")
        print("client-side TTFT and ITL (ms); server-side in = HTTP received -> engine "
              "queue, out = first token applied -> written (ms, medians)")
        print(f"{'streams':>7} {'reqs':>5} {'err':>3} {'TTFT p50':>9} {'TTFT p99':>9} "
              f"{'ITL p50':>8} {'ITL p99':>8} {'in p50':>7} {'out p50':>7} {'req/s':>7} "
              f"{'chunks/req':>10}")
        for r in rows:
            print(f"{r.concurrency:>7} {r.requests:>5} {r.errors:>3} {r.ttft_p50_ms:>9.2f} "
                  f"{r.ttft_p99_ms:>9.2f} {r.itl_p50_ms:>8.2f} {r.itl_p99_ms:>8.2f} "
                  f"{r.in_path_p50_ms:>7.2f} {r.out_path_p50_ms:>7.2f} "
                  f"{r.requests_per_s:>7.1f} {r.chunks_per_request:>10.1f}")
        print(f"requests/s with {tput.concurrency} clients, 1 output token each: "
              f"{tput.requests_per_s:.1f} ({tput.errors} errors)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
