"""An API server process: its configuration and its entry point (no heavy imports here).

The launcher imports this module to describe and start API server processes; FastAPI,
uvicorn, ZeroMQ and prometheus_client are imported only inside the started process, after
``PROMETHEUS_MULTIPROC_DIR`` is set (prometheus_client reads it when its metrics are created).
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection


@dataclass(frozen=True, slots=True)
class APIServerConfig:
    """Everything one API server process needs (picklable: it crosses the spawn)."""

    index: int  # this API server's client index (0 … api_server_count - 1)
    input_address: str  # its ROUTER (bound here; engines connect)
    output_address: str  # its PULL (bound here; engines connect)
    num_engines: int
    clock_origin_s: float  # the run's time 0 (engine.entrypoints.clock)
    served_model_name: str
    model_root: str  # the model as given on the command line (``root`` in /v1/models)
    tokenizer_dir: str | None  # tokenizer.json directory; None: token ids only
    api_key: str | None  # required as "Authorization: Bearer KEY" on /v1/*
    prometheus_dir: str  # PROMETHEUS_MULTIPROC_DIR shared by the API servers
    record_dir: str | None = None  # write this server's stage records here at shutdown
    shutdown_timeout_s: float = 5.0  # in-flight requests get this long at shutdown
    log_level: str = "warning"


#: Messages on the lifeline between the launcher and an API server.
READY = "ready"  # API server -> launcher: handshake with every engine done, serving
ENGINE_DEAD = "engine-dead"  # launcher -> API server: (ENGINE_DEAD, reason)


def run_api_server(cfg: APIServerConfig, sock: socket.socket, lifeline: Connection) -> None:
    """Entry point of an API server process: serve HTTP on ``sock`` until told to stop."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = cfg.prometheus_dir
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher orders the shutdown
    from engine.entrypoints.openai.api_server import serve

    serve(cfg, sock, lifeline)
