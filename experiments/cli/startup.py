"""A command's start-up, kept out of the cyclic garbage collector's way.

What a command makes before its work begins — imported modules, the parser, the parsed flags,
the configuration — lives as long as the command: a collection finds no garbage in it, yet
CPython's collector, left alone, runs ≈ 70 times while it is made and walks it again and again
(≈ 8 ms of a 10,000-request ``twinserve simulate``, ≈ 1% of its CPU). So start-up runs with
automatic collection paused, and what it made is frozen when it ends (``gc.freeze``: kept out
of every later collection); the command's work then runs with the collector as it was.
``command_collection`` undoes the freeze when the command returns, so a caller that runs
commands in-process (the tests) keeps its collector as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def command_collection() -> Iterator[None]:
    """One command: the objects its start-ups froze are unfrozen when it ends, unless the
    caller had frozen some itself (then its freeze, and what joined it, stays)."""
    caller_froze = gc.get_freeze_count() > 0
    try:
        yield
    finally:
        if not caller_froze:
            gc.unfreeze()


@contextmanager
def startup() -> Iterator[None]:
    """A stretch of start-up: automatic collection paused inside it, and, if it was on, what
    exists when the stretch ends frozen before it is turned back on (a caller that had turned
    it off keeps it off, and nothing is frozen for it). Garbage made meanwhile is frozen with
    the rest: start-up makes little (a few hundred objects)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()
