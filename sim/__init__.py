"""The simulated world around the engine core (SimPy runtime, workloads, cost models)."""

import engine.core  # noqa: F401  (checks the compiled build before any sim module loads)
