"""The engine core: scheduler, KV-cache manager, requests and the engine loop (clock-free)."""
