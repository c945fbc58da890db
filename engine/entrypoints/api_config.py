"""What an API server process is given (``APIServerConfig``) and the messages on its lifeline.

A leaf module: the launcher (through ``api_proc.py``) and the server itself
(``openai/api_server.py``) both read it, so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    coordinator_address: str | None = None  # the DP coordinator's PUB (DP > 1): engine loads
    router: str = "vllm"  # how this server picks an engine per request (engine/core/routing.py)
    router_load_cap: int = 8  # prefix_aware: extra in-flight requests tolerated for a hit


#: Messages on the lifeline between the launcher and an API server.
READY = "ready"  # API server -> launcher: handshake with every engine done, serving
ENGINE_DEAD = "engine-dead"  # launcher -> API server: (ENGINE_DEAD, reason)
