"""Child processes that never outlive the command that started them.

``die_with_parent`` (called first thing in a forked child: a pool worker, the report process, a
build) asks Linux to send the child SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``),
so even a ``kill -9`` of a command leaves no worker simulating or blocked forever. Elsewhere it
does nothing (the parent's orderly shutdown still stops its children). The parent's death is
tied to the *thread* that forked the child: fork children from the main thread.
"""

from __future__ import annotations

import os
import signal

from engine.core.libc import libc

#: ``prctl`` option: the signal a child gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> bool:
    """Arrange for this process to get ``sig`` when its parent dies (``parent_pid``, recorded
    by the parent before the fork, catches a parent that died before this call: then this
    process exits at once). Whether the platform supports it."""
    c = libc()
    if c is None or not hasattr(c, "prctl"):
        return False
    if c.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return True
