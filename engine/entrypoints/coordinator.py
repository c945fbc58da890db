"""The DP coordinator process (vLLM's ``DPCoordinator``): every EngineCore's load, published to
every API server for its router.

With ``-dp N`` each EngineCore pushes an ``EngineLoad`` (running and waiting requests, KV
usage) to the coordinator's PULL socket whenever its load changed after a step; the
coordinator keeps the latest of each and publishes a ``LoadSnapshot`` of all of them on its PUB
socket — at most every ``min_interval_s`` while loads change, and every ``heartbeat_s``
regardless (so an API server that subscribed late still gets one). Each API server's router
(``engine/core/routing.py``) combines the snapshot with what it knows itself (its own
requests in flight per engine).

Shutdown: SIGTERM, or the launcher's lifeline closing.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import zmq

from engine.core.process_name import set_process_name
from engine.entrypoints.wire import Codec, EngineLoad, LoadSnapshot

#: Seconds between snapshots while loads change, and between snapshots regardless.
MIN_INTERVAL_S = 0.005
HEARTBEAT_S = 0.5


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Where the coordinator listens and publishes (picklable: it crosses the spawn)."""

    num_engines: int
    load_address: str  # PULL, bound here: the EngineCores push their loads
    publish_address: str  # PUB, bound here: the API servers subscribe
    min_interval_s: float = MIN_INTERVAL_S
    heartbeat_s: float = HEARTBEAT_S


class Coordinator:
    """The coordinator's loop (one instance per coordinator process)."""

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.loads = [EngineLoad(i, 0, 0, 0.0) for i in range(cfg.num_engines)]
        self.stop = threading.Event()

    def run(self) -> None:
        cfg, codec = self.cfg, Codec()
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.bind(cfg.load_address)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(cfg.publish_address)
        changed = True
        last_sent = 0.0
        try:
            while not self.stop.is_set():
                if pull.poll(timeout=int(cfg.min_interval_s * 1000) or 1):
                    while True:
                        try:
                            message = codec.decode_engine(pull.recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                        if isinstance(message, EngineLoad) and (
                                0 <= message.engine_index < len(self.loads)):
                            changed |= self.loads[message.engine_index] != message
                            self.loads[message.engine_index] = message
                now = time.monotonic()
                due = now - last_sent >= (cfg.min_interval_s if changed else cfg.heartbeat_s)
                if due:
                    pub.send(codec.encode(LoadSnapshot(list(self.loads))))
                    last_sent, changed = now, False
        finally:
            pull.close()
            pub.close()
            ctx.term()


def run_coordinator(cfg: CoordinatorConfig, lifeline: Connection) -> None:
    """Entry point of the DP coordinator process."""
    set_process_name("DPCoordinator")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher orders the shutdown
    coordinator = Coordinator(cfg)
    signal.signal(signal.SIGTERM, lambda signum, frame: coordinator.stop.set())

    def watch() -> None:
        try:
            while True:
                lifeline.recv()
        except (EOFError, OSError):
            coordinator.stop.set()

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    coordinator.run()
