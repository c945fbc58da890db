"""The simulated world around the engine core (SimPy runtime, workloads, cost models)."""

from engine.compiled import guard_compiled_build

guard_compiled_build()  # before any compiled sim module loads: see engine/compiled.py
