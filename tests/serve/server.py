"""Start ``twinserve serve`` as a real process tree on a free 127.0.0.1 port, and stop it.

``ServerProcess`` runs the CLI in a subprocess with ``--port 0`` (the launcher binds a free
port itself, so there is no race for it) and reads the URL from the line the launcher prints
once every API server is ready. ``stop()`` sends SIGTERM (or another signal) and waits; a test
server never outlives its test: whatever is left is killed.
"""

from __future__ import annotations

import contextlib
import http.client
import json as jsonlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

READY_LINE = re.compile(r"serving \S+ on (http://127\.0\.0\.1:(\d+))")
START_TIMEOUT_S = 180.0


class ServerProcess:
    """One ``twinserve serve`` process tree."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "experiments.cli", "serve", "--port", "0", *args]
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=full_env)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        self.port = 0
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(START_TIMEOUT_S) or not self.url:
            self.kill()
            raise RuntimeError("the server did not start:\n" + self.output)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            match = READY_LINE.search(line)
            if match and not self.url:
                self.url, self.port = match.group(1), int(match.group(2))
                self._ready.set()
        self._ready.set()  # the process ended

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> Reply:
        return request(self.url, method, path, body, headers)

    def children(self) -> list[int]:
        return descendants(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Signal the launcher and wait for it; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        for pid in [*self.children(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        return jsonlib.loads(self.body)


def request(url: str, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> Reply:
    """One plain HTTP request (stdlib only): its status, body and content type."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        data = None if body is None else (
            body if isinstance(body, bytes) else jsonlib.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, resp.read(), resp.getheader("Content-Type") or "")
    finally:
        conn.close()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":  # zombies are gone already, only not reaped
            parent_of[int(entry.name)] = int(fields[1])
    out: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, parent in parent_of.items() if parent == p]
        out.extend(kids)
        frontier.extend(kids)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def wait_for(predicate: object, timeout_s: float = 20.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval_s)
    return False
