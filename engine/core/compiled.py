"""Which core modules run compiled, and a guard against compiled modules that no longer match
their sources.

``twinserve compile`` (``experiments/cmd_compile.py``) builds the simulator's hot modules with
mypyc into C extensions placed next to their ``.py`` files, where Python's import system prefers
them, and writes a manifest (``_compiled.json``) of the sources' SHA-256 in each package it
touched. A package whose ``__init__`` calls ``check_compiled_package(__file__)`` refuses to
import if a compiled module of it was built from a different source than the ``.py`` beside it
(an edit, a checkout, a pull): running stale machine code would silently ignore the change.

Compiled and interpreted modules make the same decisions and write the same records (the
compiled-core test checks a simulation both ways); only speed differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES

#: The manifest each package with compiled modules carries: {module stem: sha256 of its .py}.
MANIFEST_NAME = "_compiled.json"


def source_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compiled_stems(package_dir: str) -> list[str]:
    """Module names (file stems) that have a compiled extension in ``package_dir``."""
    stems = []
    for name in os.listdir(package_dir):
        for suffix in EXTENSION_SUFFIXES:
            if name.endswith(suffix):
                stem = name[: -len(suffix)]
                if os.path.exists(os.path.join(package_dir, stem + ".py")):
                    stems.append(stem)
                break
    return sorted(stems)


def stale_modules(package_dir: str) -> list[str]:
    """Compiled modules of ``package_dir`` whose source differs from the one they were built
    from (or that no manifest vouches for)."""
    stems = compiled_stems(package_dir)
    if not stems:
        return []
    try:
        with open(os.path.join(package_dir, MANIFEST_NAME)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    return [
        s for s in stems
        if manifest.get(s) != source_digest(os.path.join(package_dir, s + ".py"))
    ]


def check_compiled_package(package_init: str) -> None:
    """Raise ImportError if a compiled module of this package is stale (see module doc)."""
    package_dir = os.path.dirname(os.path.abspath(package_init))
    stale = stale_modules(package_dir)
    if stale:
        names = ", ".join(s + ".py" for s in stale)
        raise ImportError(
            f"{names} in {package_dir} changed since compiled by `twinserve compile`: run "
            "`twinserve compile` again, or `twinserve compile --clean` to run the Python sources"
        )


def loaded_compiled_modules() -> list[str]:
    """Names of the twinserve modules imported so far from compiled extensions."""
    out = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(("engine.", "sim.", "reports.", "experiments.")) or (
            name.endswith("__mypyc")  # mypyc's shared runtime library, not a module of ours
        ):
            continue
        path = getattr(module, "__file__", None) or ""
        if path.endswith(tuple(EXTENSION_SUFFIXES)):
            out.append(name)
    return sorted(out)
