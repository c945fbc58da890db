"""Name the running process, as vLLM names its processes (``EngineCore_DP0``, ``Worker_TP1``…).

The name is the Linux process name (``/proc/PID/comm``, what ``ps -o comm`` and ``top`` show;
at most 15 bytes), so a user — and the test that compares a live server with
``twinserve topology`` — can tell the processes of a deployment apart. Elsewhere it is a no-op.
"""

from __future__ import annotations

from engine.core.libc import libc

#: ``prctl`` option that sets the calling thread's name (the main thread's is the process's).
_PR_SET_NAME = 15
#: Longest process name Linux keeps.
MAX_NAME_BYTES = 15


def set_process_name(name: str) -> None:
    """Set this process's name (truncated to 15 bytes); nothing off Linux."""
    c = libc()
    if c is not None and hasattr(c, "prctl"):
        c.prctl(_PR_SET_NAME, name.encode()[:MAX_NAME_BYTES], 0, 0, 0)
