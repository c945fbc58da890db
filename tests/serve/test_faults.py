"""Faults and shutdown of real server process trees: a dead engine, signals, the API key,
several API servers behind one port, and the run directory a shutdown leaves."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from engine.core.events import EventKind
from experiments.cli import main as twinserve
from experiments.serve.run_dir import read_records
from tests.serve.conftest import TINY_FLAGS, assert_gone, stop_and_check
from tests.serve.metrics import scrape
from tests.serve.server import ServerProcess, alive, descendants, wait_for


def pid_of(server: ServerProcess, name: str) -> int:
    match = re.search(rf"started {name} \(pid (\d+)\)", server.output)
    assert match, server.output
    return int(match.group(1))


def test_engine_death_fails_requests_and_health(tiny_model: Path) -> None:
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS, "--engine-death-grace", "30")
    children = server.children()
    try:
        c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=60)
        outcomes: dict[str, Any] = {}

        def streaming() -> None:
            try:
                for _ in c.completions.create(model=str(tiny_model), prompt="Hi", stream=True,
                                              max_tokens=1000, extra_body={"ignore_eos": True}):
                    pass
                outcomes["stream"] = "completed"
            except openai.APIError as exc:
                outcomes["stream"] = exc

        def waiting() -> None:
            try:
                c.completions.create(model=str(tiny_model), prompt="Hi", max_tokens=1000,
                                     extra_body={"ignore_eos": True})
                outcomes["plain"] = "completed"
            except openai.APIStatusError as exc:
                outcomes["plain"] = exc

        threads = [threading.Thread(target=streaming), threading.Thread(target=waiting)]
        for t in threads:
            t.start()
        assert wait_for(lambda: scrape(server)["vllm:num_requests_running"] == 2)
        os.kill(pid_of(server, "EngineCore 0"), signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert isinstance(outcomes["stream"], openai.APIError)
        assert "engine died" in str(outcomes["stream"])
        plain = outcomes["plain"]
        assert isinstance(plain, openai.InternalServerError) and plain.status_code == 500
        assert "engine died" in plain.message
        health = server.request("GET", "/health")
        assert health.status == 503 and "engine is dead" in health.json()["error"]["message"]
        refused = server.request("POST", "/v1/completions", {"prompt": "Hi"})
        assert refused.status == 503
        assert refused.json()["error"]["type"] == "ServiceUnavailableError"
    finally:
        status = server.stop(signal.SIGTERM)  # ends the grace period at once
    assert status == 1
    assert "EngineCore process exited unexpectedly" in server.output
    assert_gone(children, server)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_process_and_releases_the_port(
    tiny_model: Path, tmp_path: Path, sig: int
) -> None:
    """A signal to the launcher stops every process of the tree; the run directory of the
    requests served is written on the way out."""
    record_dir = tmp_path / "run"
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS, "--api-server-count", "2",
                           "--record-dir", str(record_dir), "--no-plots")
    assert len(server.children()) >= 3  # an EngineCore, two API servers (+ helpers)
    c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    for i in range(6):
        c.completions.create(model=str(tiny_model), prompt=[10 + i, 11, 12], max_tokens=5,
                             stream=bool(i % 2), temperature=0.0)
    bad = server.request("POST", "/v1/completions", {"prompt": [1] * 2000})
    assert bad.status == 400
    assert stop_and_check(server, sig) == 0
    # the port is free again: a new server can listen on it (connections in TIME_WAIT may
    # remain, which SO_REUSEADDR, set by every server, allows)
    socket.create_server(("127.0.0.1", server.port)).close()
    summary = json.loads((record_dir / "summary.json").read_text())
    assert summary["completed"] == 6 and summary["failed"] == 1
    assert summary["total_output_tokens"] == 30
    meta = json.loads((record_dir / "config.json").read_text())
    assert meta["num_api_servers"] == 2 and meta["mode"] == "served"


def test_run_directory_of_a_served_run_is_reported(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run directory joins every process's stage records on one clock: the request-path
    breakdown is filled from real stages, and ``twinserve report`` rebuilds it."""
    record_dir = tmp_path / "run"
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS, "--record-dir",
                           str(record_dir), "--no-plots")
    c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    for i in range(4):
        list(c.chat.completions.create(
            model=str(tiny_model), max_completion_tokens=8, stream=True,
            messages=[{"role": "user", "content": f"Hello {i}"}],
            extra_headers={"X-Request-Id": f"client-{i}"}, extra_body={"ignore_eos": True}))
    assert stop_and_check(server) == 0
    import pandas as pd

    req = pd.read_parquet(record_dir / "requests.parquet")
    assert len(req) == 4 and req["success"].all()
    assert (req["num_output_tokens"] == 8).all()
    order = ["arrival_s", "frontend_start_s", "tokenized_s", "engine_enqueued_s", "scheduled_s",
             "first_token_s", "first_token_delivered_s", "last_token_delivered_s"]
    for earlier, later in itertools.pairwise(order):
        assert (req[earlier] <= req[later]).all(), (earlier, later)
    assert req["arrival_s"].min() == 0.0
    assert (req["seg_frontend_cpu_s"] > 0).all() and (req["seg_ipc_in_s"] > 0).all()
    assert (req["seg_output_first_s"] > 0).all()
    served = pd.read_parquet(record_dir / "served_requests.parquet")
    assert served["client_request_id"].tolist() == [f"client-{i}" for i in range(4)]
    assert (req["tokenized_s"] < served["engine_received_s"]).all()
    assert (served["engine_received_s"] <= req["engine_enqueued_s"]).all()
    steps = pd.read_parquet(record_dir / "served_steps.parquet").dropna()
    assert len(steps) and (steps["processed_s"] <= steps["delivered_s"]).all()
    records = read_records(record_dir / "records", 1)
    assert sorted(records.api_servers[0].external_ids.values()) == [
        f"client-{i}" for i in range(4)]
    kinds = set(records.api_servers[0].kinds)
    assert {EventKind.ARRIVAL, EventKind.TOKENIZED, EventKind.DELIVERED} <= kinds
    capsys.readouterr()
    assert twinserve(["report", str(record_dir), "--no-plots"]) == 0
    assert "Serving Benchmark Result" in capsys.readouterr().out


def test_api_key_and_two_api_servers(tiny_model: Path) -> None:
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS, "--api-server-count", "2",
                           "--api-key", "sesame")
    try:
        for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/models", None)):
            reply = server.request("POST" if body else "GET", path, body)
            assert reply.status == 401
            error = reply.json()["error"]
            assert error["type"] == "AuthenticationError" and error["code"] == 401
        wrong = openai.OpenAI(base_url=server.base_url, api_key="open", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        assert server.request("GET", "/health").status == 200  # open, as in vLLM
        assert server.request("GET", "/metrics").status == 200
        right = openai.OpenAI(base_url=server.base_url, api_key="sesame", max_retries=0)
        for i in range(12):  # new connections: the kernel spreads them over both servers
            openai.OpenAI(base_url=server.base_url, api_key="sesame", max_retries=0
                          ).completions.create(model=str(tiny_model), prompt=[5 + i],
                                               max_tokens=3)
        right.completions.create(model=str(tiny_model), prompt="Hi", max_tokens=3)
        values = scrape(server)  # one scrape aggregates both processes
        assert values['vllm:request_success_total{finished_reason="length"}'] == 13
        assert values["vllm:e2e_request_latency_seconds_count"] == 13
    finally:
        assert stop_and_check(server) == 0


def test_a_checkpoint_the_engine_cannot_load_stops_the_server(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The EngineCore fails while loading (no weights): its one error line, then the
    launcher's, and nothing left running."""
    import shutil
    import subprocess
    import sys

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "experiments.cli", "serve", "--model", str(broken), "--port", "0",
         *TINY_FLAGS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert any(line.startswith("twinserve: error:") and "safetensors" in line for line in lines)
    assert lines[-1].startswith("twinserve: the EngineCore process exited (status 2) before")
    assert "Traceback" not in done.stderr


def test_a_signal_during_startup_stops_everything(tiny_model: Path) -> None:
    """SIGTERM while the engine still loads: the API server stops waiting for its handshake,
    the engine stops once loaded, the launcher exits cleanly."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", "serve", "--model", str(tiny_model), "--port",
         "0", *TINY_FLAGS], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("twinserve: started API server 0"):
            break
    children = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, "".join(seen) + proc.stderr.read()
    assert "serving" not in "".join(seen)
    wait_for(lambda: not any(alive(p) for p in children), timeout_s=5.0)
    assert not [p for p in children if alive(p)]


def test_bad_command_lines_are_one_error_line(tiny_model: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = str(taken.getsockname()[1])
    for argv, words in [
        (["serve", "--model", str(tiny_model), "--port", port], "Address already in use"),
        (["serve", "--model", str(tiny_model), "--gpu", "h100-sxm"], "--gpu needs --emulate"),
        (["serve", "--model", "meta-llama/Llama-3.1-8B", "--emulate", "--dtype", "float16"],
         "--dtype needs a real model"),
        (["serve", "--model", "/nonexistent/model"], "does not exist"),
        (["serve", "--model", "no-such-model", "--emulate"], "no-such-model"),
        (["serve", "--model", str(tiny_model), "--max-model-len", "5000"], "max_model_len"),
        (["serve", "--model", str(tiny_model), "--api-server-count", "0"], "api-server-count"),
    ]:
        capsys.readouterr()
        assert twinserve(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("twinserve: error:") and words in err[0], err
    taken.close()
