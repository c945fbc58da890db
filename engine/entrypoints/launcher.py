"""``twinserve serve``'s processes: start them, watch them, stop them in order.

The layout is vLLM V1's (``engine/entrypoints/topology.py`` plans it, ``twinserve topology``
prints it): ``api_server_count`` API server processes share one listening socket (the kernel
hands each new connection to one of them) and ``data_parallel_size`` EngineCore processes each
run a scheduler and drive their model (in-process, or through one worker process per TP × PP
rank that their executor starts); ZeroMQ connects every API server to every engine, and with
DP > 1 a DP coordinator process collects the engines' loads and publishes them to the API
servers' routers. Processes are started with ``spawn`` (safe with CUDA and threads); each gets
a *lifeline* pipe to the launcher: API servers report readiness on it, the launcher reports a
dead engine on it, and a child whose lifeline closes (the launcher was killed) shuts itself
down.

The launcher's own loop waits on the processes and on signals:

* SIGINT or SIGTERM: stop the API servers first (each finishes its in-flight requests within
  ``shutdown_timeout_s``, then writes its records), then the EngineCores (each writes its
  records and stops its workers), then the DP coordinator, then close the socket; exit
  status 0;
* an EngineCore dies: every API server is told (``/health`` answers 503, requests in flight
  end with an error, new ones are refused); after ``engine_death_grace_s`` everything stops;
  exit status 1;
* an API server dies: everything stops; exit status 1.

Nothing survives the launcher: processes still alive after their grace period are killed.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from engine.core.errors import UserError
from engine.entrypoints.api_proc import ENGINE_DEAD, READY, APIServerConfig, run_api_server
from engine.entrypoints.clock import monotonic_s
from engine.entrypoints.coordinator import CoordinatorConfig, run_coordinator
from engine.entrypoints.engine_proc import EngineFactory, EngineProcConfig, run_engine_core
from engine.entrypoints.records import ENGINE_RECORD_NAME

logger = logging.getLogger("twinserve.serve")

#: Seconds the EngineCore gets to write its records and exit after SIGTERM.
ENGINE_STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """How to serve (everything but the engine itself)."""

    served_model_name: str
    model_root: str  # the model as given (``root`` in /v1/models)
    tokenizer_dir: str | None
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (printed when ready)
    api_server_count: int = 1
    api_key: str | None = None
    record_dir: str | None = None  # raw stage records of every process go here
    shutdown_timeout_s: float = 5.0
    engine_death_grace_s: float = 2.0
    log_level: str = "warning"
    data_parallel_size: int = 1  # EngineCore processes (each with its own workers)
    router: str = "vllm"  # how an API server picks an engine (engine/core/routing.py)
    router_load_cap: int = 8  # prefix_aware: extra in-flight requests tolerated for a hit

    def __post_init__(self) -> None:
        if not 1 <= self.api_server_count <= 64:
            raise UserError(f"--api-server-count must be in [1, 64], got {self.api_server_count}")
        if not 1 <= self.data_parallel_size <= 64:
            raise UserError(
                f"--data-parallel-size must be in [1, 64], got {self.data_parallel_size}")
        from engine.core.routing import make_router

        make_router(self.router, self.router_load_cap)  # an unknown name is one clear error
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in [0, 65535], got {self.port}")


@dataclass(slots=True)
class _Child:
    name: str
    process: BaseProcess
    conn: Connection  # the launcher's end of the lifeline
    ready: bool = False


class Launcher:
    """One server's processes (``run()`` blocks until the server has stopped)."""

    def __init__(self, cfg: ServeConfig, factory: EngineFactory,
                 on_ready: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.factory = factory
        self.on_ready = on_ready
        self.clock_origin_s = monotonic_s()
        self._sock = _listen(cfg.host, cfg.port)
        self._tmp = Path(tempfile.mkdtemp(prefix="twinserve-"))
        self.port = self._sock.getsockname()[1]
        self.engines: list[_Child] = []
        self.coordinator: _Child | None = None
        self.api_servers: list[_Child] = []
        self._signal_r, self._signal_w = os.pipe()

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def run(self) -> int:
        """Serve until a signal or a failure; the exit status."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._start()
            status = self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._sock.close()
            os.close(self._signal_r)
            os.close(self._signal_w)
            shutil.rmtree(self._tmp, ignore_errors=True)
        return status

    def _on_signal(self, signum: int, frame: object) -> None:
        os.write(self._signal_w, bytes([signum]))

    # -- starting -------------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.cfg
        ctx = mp.get_context("spawn")
        prometheus_dir = self._tmp / "prometheus"
        prometheus_dir.mkdir()
        record_dir = None
        if cfg.record_dir is not None:
            record_dir = Path(cfg.record_dir) / "records"
            record_dir.mkdir(parents=True, exist_ok=True)
        n = cfg.api_server_count
        inputs = tuple(f"ipc://{self._tmp}/input-{i}" for i in range(n))
        outputs = tuple(f"ipc://{self._tmp}/output-{i}" for i in range(n))
        dp = cfg.data_parallel_size
        load_address = publish_address = None
        if dp > 1:
            load_address = f"ipc://{self._tmp}/dp-loads"
            publish_address = f"ipc://{self._tmp}/dp-snapshots"
            coord_cfg = CoordinatorConfig(dp, load_address, publish_address)
            mine, theirs = ctx.Pipe(duplex=True)
            process = ctx.Process(target=run_coordinator, args=(coord_cfg, theirs),
                                  name="DPCoordinator")
            process.start()
            theirs.close()
            self.coordinator = _Child("DP coordinator", process, mine)
            _report(f"started the DP coordinator (pid {process.pid})")
        for d in range(dp):
            engine_cfg = EngineProcConfig(
                engine_index=d, input_addresses=inputs, output_addresses=outputs,
                clock_origin_s=self.clock_origin_s,
                record_path=None if record_dir is None
                else str(record_dir / ENGINE_RECORD_NAME.format(index=d)),
                coordinator_address=load_address,
            )
            mine, theirs = ctx.Pipe(duplex=True)
            process = ctx.Process(target=run_engine_core,
                                  args=(engine_cfg, self.factory, theirs),
                                  name=f"EngineCore_DP{d}")
            process.start()
            theirs.close()
            self.engines.append(_Child(f"EngineCore {d}", process, mine))
            _report(f"started EngineCore {d} (pid {process.pid})")
        for i in range(n):
            api_cfg = APIServerConfig(
                index=i, input_address=inputs[i], output_address=outputs[i], num_engines=dp,
                clock_origin_s=self.clock_origin_s, served_model_name=cfg.served_model_name,
                model_root=cfg.model_root, tokenizer_dir=cfg.tokenizer_dir,
                api_key=cfg.api_key, prometheus_dir=str(prometheus_dir),
                record_dir=None if record_dir is None else str(record_dir),
                shutdown_timeout_s=cfg.shutdown_timeout_s, log_level=cfg.log_level,
                coordinator_address=publish_address, router=cfg.router,
                router_load_cap=cfg.router_load_cap,
            )
            mine, theirs = ctx.Pipe(duplex=True)
            process = ctx.Process(target=run_api_server, args=(api_cfg, self._sock, theirs),
                                  name=f"APIServer_{i}")
            process.start()
            theirs.close()
            self.api_servers.append(_Child(f"API server {i}", process, mine))
            _report(f"started API server {i} (pid {process.pid})")

    # -- watching -------------------------------------------------------------------------------
    def _watch(self) -> int:
        announced = False
        while True:
            waitables: list[object] = [self._signal_r]
            waitables += [engine.process.sentinel for engine in self.engines]
            if self.coordinator is not None:
                waitables.append(self.coordinator.process.sentinel)
            for child in self.api_servers:
                waitables += [child.process.sentinel, child.conn]
            ready = wait(waitables)  # type: ignore[arg-type]
            if self._signal_r in ready:
                signum = os.read(self._signal_r, 1)[0]
                _report(f"received {signal.Signals(signum).name}: shutting down")
                return 0
            for child in self.api_servers:
                if child.conn in ready:
                    self._read_lifeline(child)
            for engine in self.engines:
                if engine.process.sentinel in ready:
                    return self._engine_died(engine, announced)
            if self.coordinator is not None and self.coordinator.process.sentinel in ready:
                _report(f"the DP coordinator exited unexpectedly (status "
                        f"{self.coordinator.process.exitcode}); stopping the server")
                return 1
            for child in self.api_servers:
                if child.process.sentinel in ready:
                    _report(f"{child.name} exited unexpectedly (status "
                            f"{child.process.exitcode}); stopping the server")
                    return 1
            if not announced and all(c.ready for c in self.api_servers):
                announced = True
                if self.on_ready is not None:
                    self.on_ready(self.url)

    def _read_lifeline(self, child: _Child) -> None:
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            return
        if message == READY:
            child.ready = True

    def _engine_died(self, engine: _Child, was_serving: bool) -> int:
        engine.process.join(5.0)  # reap it: its exit status
        code = engine.process.exitcode
        which = "the EngineCore process" if len(self.engines) == 1 else engine.name
        reason = f"{which} exited unexpectedly (status {code})"
        for child in self.api_servers:  # a server still waiting for the handshake stops too
            with contextlib.suppress(OSError, BrokenPipeError):
                child.conn.send((ENGINE_DEAD, reason))
        if not was_serving:
            _report(f"{which} exited (status {code}) before the server was "
                    "ready; see its messages above")
            return 1
        _report(f"{reason}; failing requests in flight and stopping the server")
        deadline = time.monotonic() + self.cfg.engine_death_grace_s
        while (left := deadline - time.monotonic()) > 0:  # a signal ends the grace early
            if self._signal_r in wait([self._signal_r], timeout=left):
                break
        return 1

    # -- stopping -------------------------------------------------------------------------------
    def _stop_all(self) -> None:
        """API servers first (they finish in-flight requests), then the engines (and their
        workers), then the DP coordinator."""
        for child in self.api_servers:
            _terminate(child.process)
        api_timeout = self.cfg.shutdown_timeout_s + 10.0
        for child in self.api_servers:
            _join(child.process, api_timeout)
        for engine in self.engines:
            _terminate(engine.process)
        for engine in self.engines:
            _join(engine.process, ENGINE_STOP_TIMEOUT_S)
        coordinator = [self.coordinator] if self.coordinator is not None else []
        for child in coordinator:
            _terminate(child.process)
            _join(child.process, ENGINE_STOP_TIMEOUT_S)
        for child in [*self.api_servers, *self.engines, *coordinator]:
            child.conn.close()


def _listen(host: str, port: int) -> socket.socket:
    try:
        sock = socket.create_server((host, port), backlog=2048)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _terminate(process: BaseProcess) -> None:
    if process.is_alive():
        with contextlib.suppress(OSError):
            process.terminate()


def _join(process: BaseProcess, timeout_s: float) -> None:
    if process.pid is None:
        return
    process.join(timeout_s)
    if process.is_alive():
        _report(f"{process.name} did not stop within {timeout_s:.0f} s: killing it")
        process.kill()
        process.join(5.0)


def _report(message: str) -> None:
    print(f"twinserve: {message}", file=sys.stderr, flush=True)
