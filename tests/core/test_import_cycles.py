"""No import circle between the project's modules, read from the AST of every file.

Every import counts, wherever it stands: at the top, inside a function (a lazy import only
hides a circle until that function runs) or under ``if TYPE_CHECKING:`` (a circle for the type
checker and for the reader, and it becomes a real one the day the import is needed at run
time). ``from pkg import name`` depends on the module ``pkg.name`` when there is one, else on
``pkg``; importing ``a.b.c`` from outside package ``a`` also runs ``a`` and ``a.b``, so those
count too (within ``a``, a package importing its own modules is the usual re-export, not a
circle). The project's packages are every top-level directory with an ``__init__.py``, so a
new one (``workload/``, ``bench/``) is checked as soon as it exists. The checker itself is
tested on snippets.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Source:
    """One module of the project: its source text and whether it is a package's __init__."""

    text: str
    is_package: bool = False


def project_modules(root: Path = ROOT) -> dict[str, Source]:
    """{module name: source} of every .py file under the root's packages."""
    modules: dict[str, Source] = {}
    for init in sorted(root.glob("*/__init__.py")):
        for path in sorted(init.parent.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules[".".join(parts)] = Source(path.read_text(), is_package)
    return modules


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported_names(tree: ast.AST, current: str, is_package: bool) -> list[str]:
    """Every name an import statement makes importable: ``import a.b`` gives ``a.b``; ``from
    a import b, c`` gives ``a.b`` and ``a.c`` (modules or not), or ``a`` for ``*``."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, current, is_package)
            names.extend(
                module if alias.name == "*" else f"{module}.{alias.name}" for alias in node.names
            )
    return names


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(modules: Mapping[str, Source]) -> dict[str, set[str]]:
    """{module: the project modules it imports} (see the module docstring for what counts)."""
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        deps: set[str] = set()
        own = set(_ancestors(name))
        for imported in _imported_names(ast.parse(source.text), name, source.is_package):
            target = imported
            while target and target not in modules:  # the deepest project module named
                target = target.rpartition(".")[0]
            if not target:
                continue
            deps.add(target)
            deps.update(a for a in _ancestors(target) if a in modules and a not in own)
        deps.discard(name)
        graph[name] = deps
    return graph


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle (``a -> b -> … -> a``) per group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle_in(group, graph) for group in groups]


def _circle_in(group: list[str], graph: Mapping[str, set[str]]) -> list[str]:
    """A shortest circle through the group's first module (breadth-first)."""
    members = set(group)
    start = group[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a group always has one


def test_no_import_cycles() -> None:
    modules = project_modules()
    assert {"engine.core.scheduler", "sim.runtime", "reports", "experiments.cli"} <= set(modules)
    cycles = import_cycles(import_graph(modules))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# -- the checker itself --------------------------------------------------------------------------

def _cycles(**sources: str) -> list[list[str]]:
    modules = {}
    for key, text in sources.items():
        is_package = key.endswith("__init__")
        modules[key.removesuffix("__init__").rstrip("_").replace("_", ".")] = Source(
            text, is_package
        )
    return import_cycles(import_graph(modules))


@pytest.mark.parametrize(
    "sources",
    [
        {"p_a": "import p.b", "p_b": "import p.a"},
        {"p_a": "from p.b import f", "p_b": "from p.c import g", "p_c": "from p.a import h"},
        {"p_a": "from p import b", "p_b": "from p import a", "p__init__": ""},
        {  # type-checking only
            "p_a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B",
            "p_b": "from p.a import A",
        },
        {"p_a": "def f():\n    from p.b import g\n    return g()", "p_b": "import p.a"},  # lazy
        {"p_a": "from .b import f", "p_b": "from . import a", "p__init__": ""},  # relative
        {  # through another package's __init__
            "p_a": "from q.m import f", "q__init__": "from p.a import g", "q_m": "",
            "p__init__": "",
        },
    ],
)
def test_checker_finds_circles(sources: dict[str, str]) -> None:
    assert _cycles(**sources)


@pytest.mark.parametrize(
    "sources",
    [
        {"p_a": "import p.b", "p_b": "import os\nfrom collections import deque"},
        {"p__init__": "from p.a import f", "p_a": "from p.b import g", "p_b": ""},  # re-export
        {"p_a": "from p import name", "p__init__": "name = 1"},
        {"p_a": "import numpy\nfrom engine.core import x", "p_b": "import p.a"},
        {"p_a": "import p.a"},
    ],
)
def test_checker_accepts(sources: dict[str, str]) -> None:
    assert _cycles(**sources) == []


def test_checker_names_the_circle() -> None:
    cycles = _cycles(p_a="import p.b", p_b="import p.c", p_c="import p.a", p_d="import p.a")
    assert cycles == [["p.a", "p.b", "p.c", "p.a"]]
