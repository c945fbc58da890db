"""twinserve's engine: the clock-free core (``engine/core``), the real worker and the server.

Importing the package first checks a compiled build (``engine/compiled.py``): no compiled
module of the core may run stale, so the check precedes them all.
"""

from engine.compiled import guard_compiled_build

guard_compiled_build()
