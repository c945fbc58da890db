"""``reports`` imports only ``engine.core.events`` and ``engine.core.errors`` of ours and the
file and process helpers every writer shares (``engine.paths``, ``engine.output_dir``,
``engine.process_guard``, ``engine.gc_freeze``, ``engine.core.libc``), plus numpy, pandas,
matplotlib, pyarrow (pandas' Parquet engine, used directly to write tables in row groups) and
the standard library (ARCHITECTURE.md §2);
``twinserve --help`` does not import pandas."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"
ALLOWED_THIRD_PARTY = {"numpy", "pandas", "matplotlib", "pyarrow"}
ALLOWED_OURS = {"engine.core.events", "engine.core.errors", "engine.paths", "engine.output_dir",
                "engine.process_guard", "engine.gc_freeze", "engine.core.libc"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_reports_import_rule():
    bad = {}
    for path in sorted(REPORTS.glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            ok = (
                name in ALLOWED_OURS or top == "reports"
                or top in ALLOWED_THIRD_PARTY or top in sys.stdlib_module_names
                or top == "__future__"
            )
            if not ok:
                bad.setdefault(path.name, []).append(name)
    assert not bad


def test_cli_help_stays_light():
    code = ("import sys, experiments.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'reports.tables') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPORTS.parent).stdout
    assert out.strip() == "[]"
