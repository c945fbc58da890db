"""Fixtures of the server tests: a tiny checkpoint, and one server per module that shares it.

Servers are real process trees (``tests/serve/server.py``) on free 127.0.0.1 ports; a fixture
always stops what it started, and asserts that nothing of the tree is left.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.worker.tiny_model import TinyModelSpec, make_tiny_model
from tests.serve.server import ServerProcess, alive, command_line, wait_for

#: Engine flags of the tiny-model servers: one torch thread (steadier beside the API server on
#: two cores), 512 KV blocks, at most 8 running requests (so 64 clients queue).
TINY_FLAGS = ("--kv-cache-memory", "4MiB", "--max-num-seqs", "8", "--cpu-threads", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(arch="llama"))


def stop_and_check(server: ServerProcess, sig: int = signal.SIGTERM) -> int:
    """Stop ``server`` with ``sig``; no process of its tree may survive it."""
    children = server.children()
    status = server.stop(sig)
    assert_gone(children, server)
    return status


def assert_gone(pids: list[int], server: ServerProcess) -> None:
    """None of ``pids`` is alive (multiprocessing's resource tracker, a child of the launcher,
    ends once it reads the end of its pipe: it gets a moment)."""
    wait_for(lambda: not any(alive(p) for p in pids), timeout_s=5.0)
    left = {pid: command_line(pid) for pid in pids if alive(pid)}
    assert not left, f"processes left after shutdown: {left}\n{server.output}"


@pytest.fixture(scope="module")
def tiny_server(tiny_model: Path) -> Iterator[ServerProcess]:
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS)
    try:
        yield server
    finally:
        status = stop_and_check(server)
        assert status == 0, server.output
