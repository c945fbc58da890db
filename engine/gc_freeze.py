"""Long-lived objects kept out of the cyclic garbage collector's way.

What a process makes before its work begins — imported modules, a command's parser, flags and
configuration, a report process's pandas and pyarrow — lives as long as the process: a
collection finds no garbage in it, yet CPython's collector, counting allocations, runs many
times while it is made and walks it again and again. ``frozen_when_done`` runs such a stretch
with automatic collection paused and freezes what exists when it ends (``gc.freeze``: kept out
of every later collection); the work after it runs with the collector as it was.
``unfrozen_when_done`` undoes those freezes when a command returns, for callers that run
commands in-process (the tests). Measured uses: ``twinserve``'s start-up
(``experiments/cli``) and the report process's imports (``reports/report_process.py``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_when_done() -> Iterator[None]:
    """Pause automatic collection inside the block; if it was on, freeze what exists when the
    block ends (raising or not), then turn it back on. A caller that had turned it off keeps
    it off, and nothing is frozen for it. Garbage made meanwhile is frozen with the rest: keep
    such blocks to start-up, which makes little."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


@contextmanager
def unfrozen_when_done() -> Iterator[None]:
    """Unfreeze, when the block ends, what ``frozen_when_done`` blocks inside it froze — unless
    the caller had frozen objects itself before (then its freeze, and what joined it, stays)."""
    caller_froze = gc.get_freeze_count() > 0
    try:
        yield
    finally:
        if not caller_froze:
            gc.unfreeze()
