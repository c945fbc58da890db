"""ARCHITECTURE.md §2's import direction, checked on the AST of every file (nothing is imported).

* ``engine/core`` imports nothing of ours but ``engine.core``; besides the standard library only
  numpy. It never reads a clock (``time.time``/``monotonic``/``perf_counter``…,
  ``datetime.now``…) and never draws unseeded randomness (the ``random`` module,
  ``numpy.random`` outside a seeded ``default_rng(seed)``, ``os.urandom``, ``uuid4``, ``secrets``).
* ``workload`` (the request streams both worlds serve) imports only ``workload``, three leaf
  modules of the core (``engine.core.config``'s field checks, ``engine.core.errors``, the SLO
  classes of ``engine.core.slo``) and ``engine.paths`` (user-given files); besides the standard
  library only numpy, and ``tokenizers`` (a leaf library: ShareGPT files are counted in tokens,
  imported only when one is read). Both worlds import it: ``sim`` and the real-run driver.
* ``engine/policies`` (the shipped scheduling policies, both worlds run them) imports only
  ``engine.core`` and ``workload`` of ours (a predictor may fit on a trace file); besides the
  standard library only numpy.
* ``sim`` imports only ``engine.core`` and ``workload`` of ours (and ``engine.compiled``, the
  compiled-build guard its package runs first, and the file helpers ``engine.paths`` /
  ``engine.output_dir``); never torch/triton, engine.worker, engine.serve or kernels.
* ``engine`` (all of it: the core, the real world, the offline ``LLM``) never imports ``sim``,
  ``experiments``, ``reports`` or ``bench``; ``engine/worker`` imports ``engine.core`` and
  ``kernels``; ``engine/serve`` imports ``engine.core``, ``engine.worker``, ``workload`` and the
  engine assembly ``engine.llm``.
* ``engine/entrypoints`` (the server processes) imports ``engine.core`` and ``engine.serve``,
  never torch/triton, the worker or the simulator: the engine behind it is given as a factory.
* ``reports`` imports only ``engine.core.events`` and ``engine.core.errors`` of ours, the file
  and process helpers every writer shares (``engine.paths``, ``engine.output_dir``,
  ``engine.process_guard``, ``engine.gc_freeze``, ``engine.core.libc``), plus
  pandas/numpy/matplotlib and pyarrow (pandas' Parquet engine, used directly to write tables in
  row groups).
* ``kernels`` imports nothing of ours.
* ``bench`` (benchmarks and GPU scripts) may import any package of ours, and none imports it
  (only its tests do).

Packages that do not exist yet are simply not checked; the checker itself is tested on snippets.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGES = frozenset(
    {"engine", "sim", "workload", "kernels", "reports", "experiments", "bench", "tests"}
)
STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class Rule:
    """What the files of one package may import."""

    ours: tuple[str, ...]  # allowed module prefixes of ours (the package itself included)
    third_party: tuple[str, ...] | None  # allowed top-level names; None = any …
    forbidden_third_party: tuple[str, ...] = ()  # … except these
    clock_free: bool = False  # no clock reads, no unseeded randomness


RULES: dict[str, Rule] = {
    "engine/core": Rule(ours=("engine.core",), third_party=("numpy",), clock_free=True),
    "workload": Rule(
        ours=("workload", "engine.core.config", "engine.core.errors", "engine.core.slo",
              "engine.paths"),
        third_party=("numpy", "tokenizers"),
    ),
    "engine/policies": Rule(
        ours=("engine.policies", "engine.core", "workload"), third_party=("numpy",)
    ),
    "sim": Rule(
        ours=("sim", "engine.core", "engine.compiled", "workload", "engine.paths",
              "engine.output_dir"), third_party=None,
        forbidden_third_party=("torch", "triton"),
    ),
    "engine": Rule(ours=("engine", "kernels", "workload"), third_party=None),
    "engine/worker": Rule(ours=("engine.worker", "engine.core", "kernels", "engine.paths",
                                "engine.output_dir", "engine.resources"), third_party=None),
    "engine/serve": Rule(
        ours=("engine.serve", "engine.core", "engine.worker", "engine.llm", "workload"),
        third_party=None,
    ),
    "engine/entrypoints": Rule(
        ours=("engine.entrypoints", "engine.serve", "engine.core"), third_party=None,
        forbidden_third_party=("torch", "triton"),
    ),
    "reports": Rule(
        ours=("reports", "engine.core.events", "engine.core.errors", "engine.paths",
              "engine.output_dir", "engine.process_guard", "engine.gc_freeze",
              "engine.core.libc"),
        third_party=("pandas", "numpy", "matplotlib", "pyarrow"),
    ),
    "kernels": Rule(ours=("kernels",), third_party=None),
    "bench": Rule(
        ours=("bench", "engine", "sim", "workload", "kernels", "reports", "experiments"),
        third_party=None,
    ),
}

#: The real world's driver of a workload (``twinserve run-real``).
REAL_RUN_DRIVER = "engine/serve/real_run.py"

#: Packages only some packages may import (beyond the package itself).
IMPORTED_ONLY_BY: dict[str, tuple[str, ...]] = {"bench": ("tests",)}

CLOCK_FUNCTIONS = frozenset(
    {
        "time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
        "process_time", "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime",
        "clock_gettime_ns",
    }
)
DATETIME_NOW = frozenset({"now", "utcnow", "today"})
SEEDED_NUMPY_RANDOM = frozenset({"default_rng", "Generator", "SeedSequence", "PCG64", "Philox"})


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(tree: ast.AST, current: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for every import; ``from X import a`` yields ``X.a`` (a may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, current, is_package)
            if module == "__future__":
                continue
            for alias in node.names:
                if alias.name == "*":
                    found.append((node.lineno, module))
                else:
                    found.append((node.lineno, f"{module}.{alias.name}" if module else alias.name))
    return found


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def import_violations(source: str, current: str, rule: Rule, is_package: bool = False) -> list[str]:
    tree = ast.parse(source)
    problems = []
    for line, module in imported_modules(tree, current, is_package):
        top = module.split(".")[0]
        if top in OUR_PACKAGES:
            if not any(_is_under(module, p) for p in rule.ours):
                problems.append(f"line {line}: imports {module}")
        elif top in STDLIB:
            continue
        elif top in rule.forbidden_third_party or (
            rule.third_party is not None and top not in rule.third_party
        ):
            problems.append(f"line {line}: imports third-party {top}")
    if rule.clock_free:
        problems.extend(clock_violations(tree))
    return problems


def clock_violations(tree: ast.AST) -> list[str]:
    """Clock reads and unseeded randomness (module aliases are followed)."""
    aliases: dict[str, str] = {}  # local name -> module it names
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                if alias.name.split(".")[0] in ("random", "secrets"):
                    problems.append(f"line {node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top = node.module.split(".")[0]
            for alias in node.names:
                name = alias.asname or alias.name
                aliases[name] = f"{node.module}.{alias.name}"
                unseeded_numpy = node.module == "numpy.random" and (
                    alias.name not in SEEDED_NUMPY_RANDOM
                )
                if top in ("random", "secrets") or unseeded_numpy:
                    problems.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
                elif node.module == "time" and alias.name in CLOCK_FUNCTIONS:
                    problems.append(f"line {node.lineno}: imports time.{alias.name}")
                elif node.module == "os" and alias.name == "urandom":
                    problems.append(f"line {node.lineno}: imports os.urandom")
                elif node.module == "uuid" and alias.name in ("uuid1", "uuid4"):
                    problems.append(f"line {node.lineno}: imports uuid.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            target = _dotted(node, aliases)
            if target is None:
                continue
            parts = target.split(".")
            reads_clock = (
                parts[0] == "time" and len(parts) == 2 and parts[1] in CLOCK_FUNCTIONS
            ) or (parts[0] == "datetime" and parts[-1] in DATETIME_NOW)
            unseeded = target in ("os.urandom", "uuid.uuid1", "uuid.uuid4") or (
                parts[:2] == ["numpy", "random"]
                and len(parts) == 3
                and parts[2] not in SEEDED_NUMPY_RANDOM
            )
            if reads_clock:
                problems.append(f"line {node.lineno}: reads the clock ({target})")
            elif unseeded:
                problems.append(f"line {node.lineno}: unseeded randomness ({target})")
        elif isinstance(node, ast.Call) and not node.args and not node.keywords:
            target = _dotted(node.func, aliases) if isinstance(
                node.func, ast.Attribute | ast.Name
            ) else None
            if target == "numpy.random.default_rng":
                problems.append(f"line {node.lineno}: default_rng() without a seed")
    return problems


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The dotted name an attribute chain refers to, with its root alias expanded."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _files(package: str) -> list[Path]:
    directory = ROOT / package
    if directory.suffix == ".py":
        return [directory] if directory.is_file() else []
    return sorted(directory.rglob("*.py")) if directory.is_dir() else []


@pytest.mark.parametrize("package", sorted(RULES))
def test_import_direction(package: str) -> None:
    rule = RULES[package]
    problems: list[str] = []
    for path in _files(package):
        source = path.read_text()
        found = import_violations(source, module_name(path), rule, path.name == "__init__.py")
        problems.extend(f"{path.relative_to(ROOT)}: {p}" for p in found)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", sorted(IMPORTED_ONLY_BY))
def test_only_its_users_import(package: str) -> None:
    importers = (package.replace("/", "."), *IMPORTED_ONLY_BY[package])
    problems = []
    for top in sorted(OUR_PACKAGES):
        for path in _files(top):
            current = module_name(path)
            if any(_is_under(current, p) for p in importers):
                continue
            tree = ast.parse(path.read_text())
            for line, module in imported_modules(tree, current, path.name == "__init__.py"):
                if _is_under(module, package.replace("/", ".")):
                    problems.append(f"{path.relative_to(ROOT)}: line {line}: imports {module}")
    assert not problems, "\n".join(problems)


def _imports_of(package: str) -> set[str]:
    found: set[str] = set()
    for path in _files(package):
        tree = ast.parse(path.read_text())
        found.update(m for _, m in imported_modules(tree, module_name(path),
                                                     path.name == "__init__.py"))
    return found


def test_both_worlds_take_their_requests_from_workload() -> None:
    """The simulator and the real-run driver build their streams with ``workload``."""
    for package in ("sim", REAL_RUN_DRIVER):
        assert _files(package), package
        assert any(_is_under(m, "workload") for m in _imports_of(package)), package
        assert not any(_is_under(m, "sim") for m in _imports_of(REAL_RUN_DRIVER))


def test_engine_core_exists_and_is_checked() -> None:
    files = _files("engine/core")
    assert len(files) >= 10
    assert module_name(ROOT / "engine/core/scheduler.py") == "engine.core.scheduler"
    assert module_name(ROOT / "engine/core/__init__.py") == "engine.core"


# -- the checker itself --------------------------------------------------------------------------

CORE = RULES["engine/core"]


@pytest.mark.parametrize(
    "source",
    [
        "import time\nx = time.time()",
        "import time as t\nx = t.monotonic()",
        "from time import perf_counter",
        "import time\nf = time.perf_counter_ns",
        "import datetime\nx = datetime.datetime.now()",
        "from datetime import datetime\nx = datetime.now()",
        "from datetime import date\nx = date.today()",
        "import random",
        "from random import Random",
        "import numpy as np\nx = np.random.rand(3)",
        "import numpy as np\nrng = np.random.default_rng()",
        "from numpy.random import randint",
        "import os\nx = os.urandom(8)",
        "import uuid\nx = uuid.uuid4()",
        "import torch",
        "import simpy",
        "from engine.worker import model_runner",
        "from engine import worker",
        "import sim.runtime",
        "from ..worker.model import Model",
        "from ... import kernels",
        "from reports import tables",
    ],
)
def test_checker_flags(source: str) -> None:
    assert import_violations(source, "engine.core.scheduler", CORE)


@pytest.mark.parametrize(
    "source",
    [
        "import time\nx = time.sleep",  # not a clock read
        "import heapq, itertools, hashlib\nfrom collections import deque",
        "from __future__ import annotations",
        "import numpy as np\nrng = np.random.default_rng(seed)",
        "import numpy as np\ng = np.random.Generator(np.random.PCG64(1))",
        "from engine.core.request import Request",
        "from engine.core import config",
        "from engine import core",
        "from .request import Request",
        "from . import hashing",
        "def f(now: float) -> float:\n    return now + 1.0",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.core import X",
    ],
)
def test_checker_accepts(source: str) -> None:
    assert import_violations(source, "engine.core.scheduler", CORE) == []


def test_checker_rules_of_other_packages() -> None:
    sim, worker, reports, kernels = (RULES[p] for p in ("sim", "engine/worker", "reports",
                                                        "kernels"))
    assert not import_violations("import simpy\nfrom engine.core.scheduler import S", "sim.x", sim)
    assert import_violations("import torch", "sim.x", sim)
    assert import_violations("from engine.worker import executor", "sim.x", sim)
    assert import_violations("import kernels", "sim.x", sim)
    assert import_violations("from reports import metrics", "sim.x", sim)
    assert not import_violations("from engine.compiled import guard_compiled_build", "sim", sim)
    assert import_violations("from engine.compiled import guard_compiled_build", "engine.core",
                             RULES["engine/core"])
    assert not import_violations(
        "import torch\nfrom kernels import paged_attention\nfrom engine.core import config",
        "engine.worker.x", worker,
    )
    assert import_violations("from sim import runtime", "engine.worker.x", worker)
    assert not import_violations(
        "import pandas as pd\nfrom engine.core.events import EventLog", "reports.x", reports
    )
    assert import_violations("from engine.core.scheduler import Scheduler", "reports.x", reports)
    assert import_violations("import torch", "reports.x", reports)
    assert not import_violations("import torch, triton\nfrom kernels.x import y", "kernels.a",
                                 kernels)
    assert import_violations("from engine.core.config import X", "kernels.a", kernels)
    assert import_violations("from .. import engine", "kernels.a", kernels)


def test_checker_rules_of_workload_and_engine() -> None:
    workload, engine, serve = (RULES[p] for p in ("workload", "engine", "engine/serve"))
    assert not import_violations(
        "import numpy as np\nfrom engine.core.errors import UserError\n"
        "from engine.core.config import is_int\nfrom workload.traces import TRACES",
        "workload.x", workload,
    )
    for source in ("import sim.config", "from engine.core.request import Request",
                   "from engine.worker import executor", "from engine.serve import frontend",
                   "import pandas", "import torch"):
        assert import_violations(source, "workload.x", workload), source
    assert not import_violations("from workload.build import build_workload", "sim.x",
                                 RULES["sim"])
    for module in ("engine.llm", "engine.serve.x", "engine.compiled"):
        assert not import_violations("from workload.stream import Workload", module, engine)
        for source in ("import sim", "from sim.config import SimConfig",
                       "from experiments.cli import main", "from reports import tables",
                       "import bench.simulator"):
            assert import_violations(source, module, engine), (module, source)
    assert not import_violations("from engine.llm import RealEngine", "engine.serve.x", serve)
    assert import_violations("from sim.workload import Workload", "engine.serve.x", serve)


def test_checker_rule_of_the_server_processes() -> None:
    server = RULES["engine/entrypoints"]
    assert not import_violations(
        "import zmq, fastapi\nfrom engine.serve.frontend import Tokenizer\n"
        "from engine.core.events import EventKind", "engine.entrypoints.x", server,
    )
    for source in ("import torch", "from sim import emulation", "from engine.worker import x",
                   "from engine.llm import LLM", "from experiments.serve import engines"):
        assert import_violations(source, "engine.entrypoints.x", server), source
