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

The load clients here (``replay``, ``closed_loop``) are ``twinserve bench serve``'s
(``experiments.loadgen``): streaming completions over keep-alive HTTP/1.1 connections on asyncio
streams (lean, because on a small machine the client shares the CPU with the server), timed as
vllm bench's client times them (TTFT: the first chunk with choices; ITL: between such chunks).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from experiments.loadgen.client import RequestOutput, RequestSpec, send_one
from experiments.loadgen.connection import ConnectionPool, Endpoint, clock
from experiments.loadgen.inputs import BenchRequest


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

    @staticmethod
    def of(out: RequestOutput, t0: float) -> ClientRecord:
        """``twinserve bench serve``'s measurement of one request, in this benchmark's terms."""
        if not out.chunk_times:
            return ClientRecord(out.start_time - t0, error=out.error or "no content")
        return ClientRecord(out.start_time - t0, out.ttft, list(out.itl), out.latency,
                            len(out.chunk_times), out.output_tokens, out.error or None)


def _spec(base_url: str) -> RequestSpec:
    """Streaming greedy completions with ``ignore_eos`` (the ``/v1`` suffix is the API's)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return RequestSpec(Endpoint.parse(root), "/v1/completions", "completions", None,
                       ignore_eos=True, extra_body={"temperature": 0.0})


def replay(base_url: str, prompts: Sequence[list[int]], max_tokens: Sequence[int],
           send_times_s: Sequence[float]) -> list[ClientRecord]:
    """Send request i at ``send_times_s[i]`` (open loop, keep-alive connections as they
    free up); one record per request, in order."""
    spec = _spec(base_url)

    async def run() -> list[ClientRecord]:
        pool = ConnectionPool(spec.endpoint)
        t0 = clock()

        async def at(i: int) -> ClientRecord:
            delay = send_times_s[i] - (clock() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            request = BenchRequest(i, f"replay-{i}", prompts[i], len(prompts[i]),
                                   max_tokens[i], send_times_s[i])
            return ClientRecord.of(await send_one(pool, spec, request, None), t0)

        try:
            return list(await asyncio.gather(*(at(i) for i in range(len(prompts)))))
        finally:
            await pool.close()

    return asyncio.run(run())


def closed_loop(base_url: str, concurrency: int, requests_per_client: int, prompt_len: int,
                output_len: int) -> tuple[list[ClientRecord], float]:
    """``concurrency`` clients, each sending requests back to back on its own keep-alive
    connection; (records, wall seconds)."""
    spec = _spec(base_url)

    async def run() -> tuple[list[ClientRecord], float]:
        t0 = clock()

        async def worker(w: int) -> list[ClientRecord]:
            pool = ConnectionPool(spec.endpoint)  # one connection per client
            out = []
            try:
                for k in range(requests_per_client):
                    prompt = [100 + (w * 7919 + k * 31 + j) % 5000 for j in range(prompt_len)]
                    request = BenchRequest(k, f"c{w}-{k}", prompt, prompt_len, output_len, 0.0)
                    out.append(ClientRecord.of(await send_one(pool, spec, request, None), t0))
            finally:
                await pool.close()
            return out

        nested = await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return [r for rs in nested for r in rs], clock() - t0

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
