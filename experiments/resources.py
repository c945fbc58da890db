"""Memory a simulated run needs, estimated before it starts (``engine.resources`` compares it
with what this machine gives).

A simulated run's peak is its per-request records — the event log, then the tables built from
it and the report — plus the interpreter with the simulator and the report stack. The figures
are measured (peak RSS of ``twinserve simulate`` at two sizes, docs/simulator.md).
"""

from __future__ import annotations

from typing import Any

from engine.resources import check_memory

#: Peak resident memory of a simulated run per request (measured; docs/simulator.md).
SIM_BYTES_PER_REQUEST = 1_700
#: Resident memory of a run's process before its records: interpreter, simulator, reports.
SIM_BASE_BYTES = 400_000_000


def simulation_bytes(num_prompts: int) -> float:
    """Estimated peak memory of one simulated run of ``num_prompts`` requests."""
    return SIM_BASE_BYTES + SIM_BYTES_PER_REQUEST * num_prompts


def check_simulation_memory(cfg: Any, parallel: int = 1) -> None:
    """Refuse a simulation (``parallel`` of them at once) this machine cannot hold."""
    num_prompts = int(cfg.workload.num_prompts)
    runs = f" × {parallel} at once" if parallel > 1 else ""
    check_memory(
        parallel * simulation_bytes(num_prompts),
        f"{num_prompts:,} requests{runs} (≈ {SIM_BYTES_PER_REQUEST / 1000:.1f} kB each)",
        "simulate fewer requests (--num-prompts)" + (", or fewer at once (--jobs)"
                                                      if parallel > 1 else ""),
    )
