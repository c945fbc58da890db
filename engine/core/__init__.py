"""The engine core: scheduler, KV-cache manager, requests and the engine loop (clock-free)."""

from engine.core.compiled import check_compiled_build

check_compiled_build()  # a stale compiled build never runs: see engine/core/compiled.py
