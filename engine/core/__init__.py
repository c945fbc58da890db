"""The engine core: scheduler, KV-cache manager, requests and the engine loop (clock-free)."""

from engine.core.compiled import check_compiled_package

check_compiled_package(__file__)  # refuse compiled modules older than their sources
