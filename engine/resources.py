"""What this machine can give a command: memory and CPUs, for checks made before any work.

A run whose estimated footprint exceeds the memory this process may use is refused in one
line before it starts (``check_memory``), instead of being killed, or thrashing, hours in.
The limit is the smallest of the machine's physical memory, the cgroup's memory limit (a
container) and the process's address-space limit (``ulimit -v``); a run may plan on
``MEMORY_FRACTION`` of it, the rest being the interpreter, the libraries and everyone else.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from engine.core.errors import UserError

#: The share of the memory limit one command may plan to fill.
MEMORY_FRACTION = 0.8
#: Threads per CPU beyond which more torch threads only slow a run down.
MAX_THREADS_PER_CPU = 4


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """The most memory this process may use, and which limit set it."""

    num_bytes: int
    source: str  # "physical memory", "cgroup limit" or "address-space limit (ulimit -v)"


def _cgroup_limit_bytes() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def memory_limit() -> MemoryLimit:
    """The smallest memory limit that applies to this process."""
    limits = [MemoryLimit(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                          "physical memory")]
    cgroup = _cgroup_limit_bytes()
    if cgroup is not None:
        limits.append(MemoryLimit(cgroup, "cgroup limit"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(MemoryLimit(soft, "address-space limit (ulimit -v)"))
    return min(limits, key=lambda m: m.num_bytes)


def format_gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:,.1f} GB"


def check_memory(need_bytes: float, what: str, hint: str) -> None:
    """Refuse a run that needs more than ``MEMORY_FRACTION`` of the memory limit; ``what``
    names the run ("100,000,000 requests"), ``hint`` what to change."""
    limit = memory_limit()
    allowed = MEMORY_FRACTION * limit.num_bytes
    if need_bytes > allowed:
        raise UserError(
            f"{what} need about {format_gb(need_bytes)} of memory, more than this machine "
            f"can give a run ({format_gb(allowed)}: {MEMORY_FRACTION:.0%} of its "
            f"{format_gb(limit.num_bytes)} {limit.source}); {hint}"
        )


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_threads() -> int:
    """The most CPU threads a flag may ask for on this machine."""
    return MAX_THREADS_PER_CPU * cpu_count()
