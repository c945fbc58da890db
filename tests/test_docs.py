"""The documentation agrees with the code: docs/structure.md lists every module (and nothing that
is gone), every document the code cites is in the repository, and the README's layout names every
package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "workload", "sim", "kernels", "reports", "experiments", "bench")
CODE_DIRS = (*PACKAGES, "tests")


def modules() -> set[str]:
    found = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "data" not in rel.parts and "build" not in rel.parts:
                found.add(rel.as_posix())
    return found


def listed_in_structure() -> list[str]:
    text = (ROOT / "docs" / "structure.md").read_text()
    return re.findall(r"^- `([^`]+\.py)` — \S", text, flags=re.MULTILINE)


def test_structure_lists_every_module_once() -> None:
    listed = listed_in_structure()
    assert len(listed) == len(set(listed)), "a module is listed twice"
    missing = sorted(modules() - set(listed))
    gone = sorted(set(listed) - modules())
    assert not missing, f"docs/structure.md does not list {missing}"
    assert not gone, f"docs/structure.md lists modules that do not exist: {gone}"


def test_every_cited_document_is_in_the_repository() -> None:
    """Specs are cited by name (``SCHEDULER_SPEC.md §2``), guides by path (``docs/roofline.md``);
    lower-case bare names such as ``report.md`` are files the code writes, not citations."""
    cited: dict[str, str] = {}
    for d in CODE_DIRS:
        for path in (ROOT / d).rglob("*.py"):
            text = path.read_text()
            for name in re.findall(r"\b([A-Z][A-Z_]*\.md|docs/[\w/.-]+\.md)\b", text):
                cited.setdefault(name, str(path.relative_to(ROOT)))
    available = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    for name, where in sorted(cited.items()):
        if name.startswith("docs/"):
            assert (ROOT / name).exists(), f"{where} cites {name}, which does not exist"
        else:
            assert name in available, f"{where} cites {name}, which is not in the repository"


def test_readme_layout_names_every_package() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    for pkg in PACKAGES:
        assert re.search(rf"^{re.escape(pkg)}/", layout, flags=re.MULTILINE), pkg
    for sub in sorted(p.parent for p in (ROOT / "engine").glob("*/__init__.py")):
        name = sub.relative_to(ROOT).as_posix()
        assert f"{name}/" in layout, f"README's layout does not name {name}/"
