"""The simulated world around the engine core (SimPy runtime, workloads, cost models)."""

from engine.core.compiled import check_compiled_package

check_compiled_package(__file__)  # refuse compiled modules older than their sources
