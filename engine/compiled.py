"""Which modules run compiled, and a guard that never lets a stale compiled module run.

``twinserve compile`` (``experiments/cmd_compile.py``) builds the simulator's hot modules with
mypyc into C extensions placed next to their ``.py`` files, where Python's import system prefers
them, and writes one manifest (``engine/core/_compiled.json``: module name → SHA-256 of the
source it was built from). The modules form one build: compiled modules call each other's
native code directly, so they are used all together or not at all.

``guard_compiled_build`` runs once per process, when the first of the two packages that hold
compiled modules is imported: ``engine`` (``engine/__init__.py``, before ``engine.core`` and its
subpackages) or ``sim`` (``sim/__init__.py``). It lives here, above the core, so that the core
itself stays free of file-system reads and import hooks. If any compiled module's source
differs from the manifest (an edit, a checkout, an interrupted build), it installs an import
finder that loads the ``.py`` sources of *every* compiled module and says so once on stderr: an
edit is never silently ignored, every command keeps working (slower), and ``twinserve compile``
/ ``--clean`` can repair the tree. ``TWINSERVE_COMPILED=0`` in the environment makes it run the
sources of a fresh build too, quietly (the test suite sets it: it tests the sources).

Compiled and interpreted modules make the same decisions and write the same records (the
compiled-core test checks a simulation both ways); only speed differs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from types import ModuleType

#: Packages (relative to the tree's root) that may hold compiled modules.
PACKAGES: tuple[str, ...] = ("engine/core", "engine/core/bulk", "sim", "sim/cost")

#: Environment variable: "0" runs the Python sources even of a fresh compiled build.
SOURCES_ENV_VAR = "TWINSERVE_COMPILED"

#: The build's manifest, in ``engine/core``: {module name: sha256 of its source}.
MANIFEST_NAME = "_compiled.json"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest_path(root: str = ROOT) -> str:
    return os.path.join(root, "engine", "core", MANIFEST_NAME)


def compiled_stems(package_dir: str) -> list[str]:
    """Module names (file stems) with an extension *for this interpreter* in ``package_dir``
    and a ``.py`` source beside it (mypyc's runtime library has none)."""
    stems = []
    for name in os.listdir(package_dir):
        for suffix in EXTENSION_SUFFIXES:
            if name.endswith(suffix):
                stem = name[: -len(suffix)]
                if os.path.exists(os.path.join(package_dir, stem + ".py")):
                    stems.append(stem)
                break
    return sorted(stems)


def compiled_on_disk(root: str = ROOT, packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """{module name: path of its source} for every module compiled for this interpreter."""
    out = {}
    for pkg in packages:
        d = os.path.join(root, pkg)
        if os.path.isdir(d):
            for stem in compiled_stems(d):
                out[pkg.replace("/", ".") + "." + stem] = os.path.join(d, stem + ".py")
    return out


def stale_modules(root: str = ROOT, packages: Sequence[str] = PACKAGES) -> list[str]:
    """Compiled modules whose source differs from the one the manifest says they were built
    from (or that the manifest does not list)."""
    on_disk = compiled_on_disk(root, packages)
    if not on_disk:
        return []
    try:
        with open(manifest_path(root)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    return sorted(n for n, path in on_disk.items() if manifest.get(n) != source_digest(path))


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Imports the listed modules from their ``.py`` sources, ignoring compiled extensions."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def check_compiled_build(root: str = ROOT, packages: Sequence[str] = PACKAGES) -> list[str]:
    """If any compiled module is stale, run the sources of all of them (see module doc).

    Returns the stale modules (empty: the build is fresh, or there is none). With
    ``TWINSERVE_COMPILED=0`` the sources run whatever the build's state, and nothing is said.
    """
    if os.environ.get(SOURCES_ENV_VAR) == "0":
        _run_sources(root, packages)
        return []
    stale = stale_modules(root, packages)
    if stale and _run_sources(root, packages):
        names = ", ".join(n.replace(".", "/") + ".py" for n in stale)
        sys.stderr.write(
            f"twinserve: {names} changed after the last `twinserve compile`: running the Python "
            "sources of every compiled module (slower). Rebuild with `twinserve compile`, or "
            "remove the build with `twinserve compile --clean`.\n"
        )
    return stale


def _run_sources(root: str, packages: Sequence[str]) -> bool:
    """Import every compiled module of the tree from its source from now on; False if that
    was already so (or there is none)."""
    sources = compiled_on_disk(root, packages)
    if not sources or any(
        isinstance(f, _SourcesFirst) and f.sources.items() >= sources.items()
        for f in sys.meta_path
    ):
        return False
    sys.meta_path.insert(0, _SourcesFirst(sources))
    return True


_guarded = False  # guard_compiled_build ran in this process


def guard_compiled_build() -> None:
    """``check_compiled_build`` of this tree, once per process (the packages that hold compiled
    modules call it before any of them can load)."""
    global _guarded
    if not _guarded:
        _guarded = True
        check_compiled_build()


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
