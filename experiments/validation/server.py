"""The server ``twinserve validate`` measures: ``twinserve serve`` as a process tree, pinned.

``ServerUnderTest`` starts ``twinserve serve`` (one API server process, one EngineCore process)
on a free port with the engine flags of the run, a record directory, the in-place profile and
the step-shape record (``experiments.validation.served_engine``), reads its URL and process ids
from the launcher's lines, and stops it with SIGTERM (its records are written then).

``CpuLayout`` is the noise control of a small shared host: the EngineCore on one CPU (pinned
from inside, before torch starts its threads), the API server on another (every thread of it,
once it is ready), the load generator with the API server (it mostly sleeps on its sockets) —
or on a third CPU where there is one. With a single CPU nothing is pinned.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import UserError

READY = re.compile(r"serving \S+ on (http://\S+) ")
STARTED = re.compile(r"started (EngineCore|API server) (\d+) \(pid (\d+)\)")
START_TIMEOUT_S = 900.0  # a GPU profile of an 8B model takes minutes


@dataclass(frozen=True, slots=True)
class CpuLayout:
    """Which CPUs each part runs on (None: not pinned)."""

    engine: tuple[int, ...] | None
    api_server: tuple[int, ...] | None
    client: tuple[int, ...] | None

    @staticmethod
    def plan(pin: bool) -> CpuLayout:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not pin or len(cpus) < 2:
            return CpuLayout(None, None, None)
        client = (cpus[2],) if len(cpus) >= 3 else (cpus[1],)
        return CpuLayout((cpus[0],), (cpus[1],), client)

    def describe(self) -> str:
        if self.engine is None:
            return "not pinned"
        return (f"EngineCore on CPU {self.engine}, API server on {self.api_server}, "
                f"load generator on {self.client}")


def pin_process(pid: int, cpus: Sequence[int]) -> None:
    """Pin every thread of process ``pid`` (a thread keeps its own mask on Linux)."""
    tasks = Path(f"/proc/{pid}/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [pid]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, set(cpus))


@dataclass(frozen=True, slots=True)
class ServeSpec:
    """How to start the server."""

    model: str
    engine_flags: tuple[str, ...]  # serve's engine flags (``serve_flags``)
    record_dir: Path
    profile_csv: Path | None
    profile_grid: str
    step_shapes: Path
    layout: CpuLayout
    cpu_threads: int = 1


def serve_flags(engine_args: Any) -> list[str]:
    """``twinserve serve``'s flags for an ``engine.llm.EngineArgs``."""
    a, k = engine_args, engine_args.engine
    flags = ["--dtype", a.dtype, "--device", a.device, "--gpu-memory-utilization",
             str(a.gpu_memory_utilization), "--load-format", a.load_format, "--seed", str(a.seed),
             "--block-size", str(k.block_size),
             "--enable-prefix-caching" if k.enable_prefix_caching else "--no-enable-prefix-caching",
             "--enable-chunked-prefill" if k.enable_chunked_prefill
             else "--no-enable-chunked-prefill",
             "--async-scheduling" if k.async_scheduling else "--no-async-scheduling"]
    optional = {"--max-model-len": a.max_model_len, "--num-gpu-blocks-override": a.num_gpu_blocks,
                "--kv-cache-memory": a.kv_cache_memory, "--attention-backend": a.attention_backend,
                "--tokenizer": a.tokenizer, "--max-num-batched-tokens": k.max_num_batched_tokens,
                "--max-num-seqs": k.max_num_seqs,
                "--long-prefill-token-threshold": k.long_prefill_token_threshold or None}
    for flag, value in optional.items():
        if value is not None:
            flags += [flag, str(value)]
    return flags


class ServerUnderTest:
    """One ``twinserve serve`` process tree (see the module docstring)."""

    def __init__(self, spec: ServeSpec, log: Callable[[str], None]) -> None:
        self.spec = spec
        cmd = [sys.executable, "-m", "experiments.cli", "serve", "--model", spec.model,
               "--port", "0", "--api-server-count", "1", "--record-dir", str(spec.record_dir),
               "--no-plots", "--cpu-threads", str(spec.cpu_threads),
               "--step-shapes-out", str(spec.step_shapes), *spec.engine_flags]
        if spec.profile_csv is not None:
            cmd += ["--profile-out", str(spec.profile_csv), "--profile-grid", spec.profile_grid]
        if spec.layout.engine is not None:
            cmd += ["--engine-cpus", ",".join(map(str, spec.layout.engine))]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=False)
        self.lines: list[str] = []
        self.url = ""
        self.pids: dict[str, int] = {}
        self._ready = threading.Event()
        self._log = log
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(START_TIMEOUT_S) or not self.url:
            self.kill()
            raise UserError("the server did not start:\n" + "".join(self.lines[-20:]))
        if spec.layout.api_server is not None:
            for name, pid in self.pids.items():
                if name.startswith("API server"):
                    pin_process(pid, spec.layout.api_server)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if (m := STARTED.search(line)) is not None:
                self.pids[f"{m.group(1)} {m.group(2)}"] = int(m.group(3))
            if (m := READY.search(line)) is not None and not self.url:
                self.url = m.group(1)
                self._ready.set()
            if "error" in line.lower() or "Traceback" in line:
                self._log(line.rstrip())
        self._ready.set()

    def stop(self, timeout_s: float = 120.0) -> None:
        """SIGTERM and wait: every process writes its records, the launcher its run directory."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise UserError("the server did not stop in time; its records are lost") from None
        if status != 0:
            raise UserError(f"the server exited with status {status}:\n"
                            + "".join(self.lines[-20:]))

    def kill(self) -> None:
        for pid in [*self.pids.values(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
