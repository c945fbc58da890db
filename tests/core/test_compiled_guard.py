"""The stale-build guard of ``engine.core.compiled`` and ``twinserve compile --status/--clean``
on a fake tree (no compiler needed: the extension files are never imported here)."""

from __future__ import annotations

import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from engine.core.compiled import (
    MANIFEST_NAME,
    check_compiled_package,
    compiled_stems,
    source_digest,
    stale_modules,
)
from experiments.cmd_compile import clean, status

EXT = EXTENSION_SUFFIXES[0]


def _package(tmp_path: Path, *, compiled: tuple[str, ...], vouched: tuple[str, ...]) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for stem in ("fast", "slow"):
        (pkg / f"{stem}.py").write_text(f"X = {stem!r}\n")
    for stem in compiled:
        (pkg / f"{stem}{EXT}").write_bytes(b"not really an extension")
    (pkg / f"_runtime__mypyc{EXT}").write_bytes(b"no .py beside it: not a module of ours")
    manifest = {s: source_digest(str(pkg / f"{s}.py")) for s in vouched}
    (pkg / MANIFEST_NAME).write_text(json.dumps(manifest))
    return pkg


def test_fresh_compiled_modules_pass(tmp_path: Path) -> None:
    pkg = _package(tmp_path, compiled=("fast",), vouched=("fast",))
    assert compiled_stems(str(pkg)) == ["fast"]
    assert stale_modules(str(pkg)) == []
    check_compiled_package(str(pkg / "__init__.py"))


def test_edited_source_makes_its_package_refuse_to_import(tmp_path: Path) -> None:
    pkg = _package(tmp_path, compiled=("fast", "slow"), vouched=("fast", "slow"))
    (pkg / "slow.py").write_text("X = 'edited'\n")
    assert stale_modules(str(pkg)) == ["slow"]
    with pytest.raises(ImportError, match=r"slow\.py in .* changed since compiled.*--clean"):
        check_compiled_package(str(pkg / "__init__.py"))


def test_compiled_module_without_a_manifest_entry_is_stale(tmp_path: Path) -> None:
    pkg = _package(tmp_path, compiled=("fast", "slow"), vouched=("fast",))
    assert stale_modules(str(pkg)) == ["slow"]
    (pkg / MANIFEST_NAME).write_text("{not json")
    assert stale_modules(str(pkg)) == ["fast", "slow"]


def test_status_and_clean(tmp_path: Path) -> None:
    pkg = _package(tmp_path, compiled=("fast", "slow"), vouched=("fast",))
    modules = ("pkg/fast.py", "pkg/slow.py", "pkg/__init__.py")
    assert status(tmp_path, modules) == {
        "pkg/fast.py": "compiled", "pkg/slow.py": "stale", "pkg/__init__.py": "python",
    }
    removed = {p.name for p in clean(tmp_path, modules)}
    assert removed == {f"fast{EXT}", f"slow{EXT}", f"_runtime__mypyc{EXT}", MANIFEST_NAME}
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "fast.py", "slow.py"]
    assert set(status(tmp_path, modules).values()) == {"python"}
