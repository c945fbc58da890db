"""The one loader of the C library (``engine.core.libc``) and the two process helpers that
use it: naming a process and dying with the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import engine.core.libc as libc_module
from engine.core.libc import libc
from tests.serve.server import alive

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


@linux_only
def test_glibc_is_loaded_once_per_process() -> None:
    first = libc()
    assert first is not None and libc() is first
    assert hasattr(first, "prctl") and hasattr(first, "mallopt")


@linux_only
def test_without_glibc_the_processs_own_c_library_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where ``libc.so.6`` does not open (musl), the symbols Python was linked with serve."""
    monkeypatch.setattr(libc_module, "GLIBC_SONAME", "libc-that-is-not-here.so.0")
    libc.cache_clear()
    try:
        fallback = libc()
        assert fallback is not None and hasattr(fallback, "prctl")
        assert fallback._name is None  # the process's own symbols, not a searched file
    finally:
        libc.cache_clear()


@linux_only
def test_a_process_name_is_cut_to_fifteen_bytes() -> None:
    name = _python("""
        from engine.core.process_name import set_process_name
        set_process_name("EngineCore_DP0_and_more")
        print(open("/proc/self/comm").read())
    """)
    assert name == "EngineCore_DP0_"


@linux_only
def test_a_child_dies_with_its_parent() -> None:
    child_pid = int(_python("""
        import os, time
        from engine.process_guard import die_with_parent
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            quiet = os.open(os.devnull, os.O_WRONLY)  # the test reads the parent's output only
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            die_with_parent(parent_pid=parent)
            time.sleep(60)
            os._exit(0)
        print(pid, flush=True)
        time.sleep(0.3)
        os._exit(0)
    """))
    deadline = time.monotonic() + 10.0
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive(child_pid):
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the child outlived its parent")
