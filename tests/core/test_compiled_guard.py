"""The compiled-build guard of ``engine.compiled`` and ``twinserve compile --status/--clean``
on a fake tree (no compiler needed: the fake extension files are never loaded)."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from engine import compiled
from engine.compiled import (
    check_compiled_build,
    compiled_on_disk,
    manifest_path,
    source_digest,
    stale_modules,
)
from engine.core.errors import UserError
from experiments.cli import cmd_compile
from experiments.cli.cmd_compile import HOT_MODULES, clean, compile_if_needed, is_fresh, status

EXT = EXTENSION_SUFFIXES[0]


def _tree(tmp_path: Path, *, vouched: tuple[str, ...]) -> Path:
    """A tree with package ``fakepkg`` (modules fast, slow: both "compiled") beside an
    ``engine/core`` holding the manifest, which vouches for ``vouched``."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for stem in ("fast", "slow"):
        (pkg / f"{stem}.py").write_text(f"X = {stem!r}\n")
        (pkg / f"{stem}{EXT}").write_bytes(b"not an extension: importing it would fail")
    (pkg / f"_runtime__mypyc{EXT}").write_bytes(b"no .py beside it: not a module of ours")
    (tmp_path / "engine" / "core").mkdir(parents=True)
    manifest = {f"fakepkg.{s}": source_digest(str(pkg / f"{s}.py")) for s in vouched}
    Path(manifest_path(str(tmp_path))).write_text(json.dumps(manifest))
    return tmp_path


@pytest.fixture(autouse=True)
def _compiled_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the guard itself: without the suite's TWINSERVE_COMPILED=0."""
    monkeypatch.delenv(compiled.SOURCES_ENV_VAR, raising=False)


@pytest.fixture
def clean_imports() -> Iterator[None]:
    meta_path = list(sys.meta_path)
    yield
    sys.meta_path[:] = meta_path
    for name in [n for n in sys.modules if n == "fakepkg" or n.startswith("fakepkg.")]:
        del sys.modules[name]


def test_fresh_build_is_left_alone(tmp_path: Path) -> None:
    root = _tree(tmp_path, vouched=("fast", "slow"))
    assert sorted(compiled_on_disk(str(root), ("fakepkg",))) == ["fakepkg.fast", "fakepkg.slow"]
    assert stale_modules(str(root), ("fakepkg",)) == []
    before = list(sys.meta_path)
    assert check_compiled_build(str(root), ("fakepkg",)) == []
    assert sys.meta_path == before


def test_unvouched_or_edited_modules_are_stale(tmp_path: Path) -> None:
    root = _tree(tmp_path, vouched=("fast",))
    assert stale_modules(str(root), ("fakepkg",)) == ["fakepkg.slow"]
    (root / "fakepkg" / "fast.py").write_text("X = 'edited'\n")
    assert stale_modules(str(root), ("fakepkg",)) == ["fakepkg.fast", "fakepkg.slow"]
    Path(manifest_path(str(root))).write_text("{not json")
    assert stale_modules(str(root), ("fakepkg",)) == ["fakepkg.fast", "fakepkg.slow"]


def test_stale_build_runs_the_sources_of_every_module_and_says_so(
    tmp_path: Path, clean_imports: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path, vouched=("fast", "slow"))
    (root / "fakepkg" / "slow.py").write_text("X = 'edited'\n")
    assert check_compiled_build(str(root), ("fakepkg",)) == ["fakepkg.slow"]
    err = capsys.readouterr().err
    assert "fakepkg/slow.py changed after the last `twinserve compile`" in err
    assert "twinserve compile --clean" in err
    sys.path.insert(0, str(root))
    try:
        # the fresh one too: compiled modules of one build call each other natively
        assert importlib.import_module("fakepkg.fast").X == "fast"
        assert importlib.import_module("fakepkg.slow").X == "edited"
    finally:
        sys.path.remove(str(root))
    assert check_compiled_build(str(root), ("fakepkg",)) == ["fakepkg.slow"]
    assert capsys.readouterr().err == ""  # one finder, one message per process


def test_status_and_clean(tmp_path: Path) -> None:
    root = _tree(tmp_path, vouched=("fast",))
    modules, packages = ("fakepkg/fast.py", "fakepkg/slow.py", "fakepkg/__init__.py"), ("fakepkg",)
    assert status(root, modules, packages) == {
        "fakepkg/fast.py": "compiled", "fakepkg/slow.py": "stale",
        "fakepkg/__init__.py": "python",
    }
    (root / "build" / "mypyc").mkdir(parents=True)
    removed = {p.name for p in clean(root, packages)}
    assert removed == {f"fast{EXT}", f"slow{EXT}", f"_runtime__mypyc{EXT}", "_compiled.json"}
    assert sorted(p.name for p in (root / "fakepkg").iterdir()) == [
        "__init__.py", "fast.py", "slow.py"
    ]
    assert not (root / "build").exists()
    assert set(status(root, modules, packages).values()) == {"python"}


def test_hot_modules_lie_in_the_guarded_packages() -> None:
    assert {str(Path(m).parent) for m in HOT_MODULES} <= set(compiled.PACKAGES)


def test_sources_variable_runs_the_sources_of_a_fresh_build_quietly(
    tmp_path: Path, clean_imports: None, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = _tree(tmp_path, vouched=("fast", "slow"))
    monkeypatch.setenv(compiled.SOURCES_ENV_VAR, "0")
    assert check_compiled_build(str(root), ("fakepkg",)) == []
    assert capsys.readouterr().err == ""
    sys.path.insert(0, str(root))
    try:
        assert importlib.import_module("fakepkg.fast").X == "fast"  # the .py, not the fake .so
    finally:
        sys.path.remove(str(root))


def test_set_up_compiles_only_when_needed_and_never_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules, packages = ("fakepkg/fast.py", "fakepkg/slow.py"), ("fakepkg",)
    (tmp_path / "fresh").mkdir()
    (tmp_path / "stale").mkdir()
    fresh = _tree(tmp_path / "fresh", vouched=("fast", "slow"))
    assert is_fresh(fresh, modules, packages)
    assert compile_if_needed(fresh, modules=modules, packages=packages) == (
        "compiled build up to date (2 modules)"
    )
    stale = _tree(tmp_path / "stale", vouched=("fast",))
    assert not is_fresh(stale, modules, packages)
    monkeypatch.setattr(cmd_compile, "missing_toolchain", lambda: "no C compiler found")
    line = compile_if_needed(stale, modules=modules, packages=packages)
    assert line.startswith("not compiling the simulator's hot modules (no C compiler found)")
    assert "Python sources" in line and "\n" not in line

    def failing_build(root: Path, modules: Sequence[str], jobs: int | None = None) -> float:
        raise UserError("mypyc build failed (nothing was installed):\nerror: line 1\nmore")

    built: list[Path] = []

    def build(root: Path, modules: Sequence[str], jobs: int | None = None) -> float:
        built.append(root)
        return 61.2

    monkeypatch.setattr(cmd_compile, "missing_toolchain", lambda: None)
    monkeypatch.setattr(cmd_compile, "compile_modules", failing_build)
    line = compile_if_needed(stale, modules=modules, packages=packages)
    assert line.startswith("mypyc build failed (nothing was installed): the simulator runs")
    assert "\n" not in line
    monkeypatch.setattr(cmd_compile, "compile_modules", build)
    assert compile_if_needed(stale, modules=modules, packages=packages) == (
        "compiled 2 modules in 61 s"
    )
    assert built == [stale]
