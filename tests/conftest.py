"""Suite-wide guard: the tests check the Python sources unless asked to test compiled ones.

Compiled modules (``twinserve compile``) shadow the ``.py`` files, and several tests patch
methods of core classes, which compiled classes do not allow. ``tests/sim/test_compiled_core.py``
checks a compiled build in a copy of the tree; run ``twinserve compile --clean`` before the
suite, or set ``TWINSERVE_TEST_COMPILED=1`` to run tests against an in-tree compiled build.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TWINSERVE_TEST_COMPILED") == "1":
        return
    import sim.runtime  # noqa: F401  (imports every compiled module, if any is in use)
    from engine.compiled import loaded_compiled_modules

    compiled = loaded_compiled_modules()
    if compiled:
        pytest.exit(
            f"{len(compiled)} core modules run compiled in this tree (twinserve compile): the "
            "suite tests the Python sources. Run `twinserve compile --clean` first, or set "
            "TWINSERVE_TEST_COMPILED=1 to test the compiled build.",
            returncode=4,
        )
