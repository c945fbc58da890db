"""Suite-wide guard: the tests check the Python sources unless asked to test compiled ones.

Compiled modules (``twinserve compile``, which ``make demo`` runs) shadow the ``.py`` files, and
several tests patch methods of core classes, which compiled classes do not allow. So the suite
sets ``TWINSERVE_COMPILED=0`` before anything of twinserve is imported: this process, and every
command a test starts, imports the sources even where a compiled build is present
(``engine/compiled.py``). ``tests/sim/test_compiled_core.py`` checks a compiled build in a copy
of the tree; ``TWINSERVE_TEST_COMPILED=1`` runs the tests against an in-tree compiled build.
"""

from __future__ import annotations

import os

import pytest

#: ``engine.compiled.SOURCES_ENV_VAR``, set before anything imports ``engine`` (whose import
#: decides, once per process, whether compiled modules are used).
SOURCES_ENV_VAR = "TWINSERVE_COMPILED"

if os.environ.get("TWINSERVE_TEST_COMPILED") != "1":
    os.environ[SOURCES_ENV_VAR] = "0"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TWINSERVE_TEST_COMPILED") == "1":
        return
    import sim.runtime  # noqa: F401  (imports every compiled module, if any were in use)
    from engine import compiled

    assert compiled.SOURCES_ENV_VAR == SOURCES_ENV_VAR
    loaded_compiled_modules = compiled.loaded_compiled_modules

    compiled = loaded_compiled_modules()
    if compiled:
        pytest.exit(
            f"{len(compiled)} core modules run compiled although {SOURCES_ENV_VAR}=0: the "
            "suite tests the Python sources (was a twinserve module imported before the "
            "suite's conftest?). Set TWINSERVE_TEST_COMPILED=1 to test the compiled build.",
            returncode=4,
        )
