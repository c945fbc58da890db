"""An API server process: its configuration and its entry point (no heavy imports here).

The launcher imports this module to describe and start API server processes; FastAPI,
uvicorn, ZeroMQ and prometheus_client are imported only inside the started process, after
``PROMETHEUS_MULTIPROC_DIR`` is set (prometheus_client reads it when its metrics are created).
"""

from __future__ import annotations

import os
import signal
import socket
from multiprocessing.connection import Connection

from engine.core.process_name import set_process_name

# Re-exported for the launcher: the configuration lives in a leaf module (``api_config.py``)
# that the server imports, so that it need not import this module.
from engine.entrypoints.api_config import ENGINE_DEAD as ENGINE_DEAD
from engine.entrypoints.api_config import READY as READY
from engine.entrypoints.api_config import APIServerConfig as APIServerConfig


def run_api_server(cfg: APIServerConfig, sock: socket.socket, lifeline: Connection) -> None:
    """Entry point of an API server process: serve HTTP on ``sock`` until told to stop."""
    set_process_name(f"APIServer_{cfg.index}")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = cfg.prometheus_dir
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher orders the shutdown
    from engine.entrypoints.openai.api_server import serve

    serve(cfg, sock, lifeline)
