"""The compiled build (``twinserve compile``) decides and records exactly what the sources do.

The hot modules are compiled with mypyc once, in a copy of the tree (about a minute on two
cores). In that copy: every compiled module is the one imported; the golden vLLM replays, the
scheduler tests and the exact event-log tests pass against the compiled modules; a simulation
writes the same tables and summary as the Python sources; and editing a compiled module's
source makes the whole build run from the sources (and say so). Skipped, with the reason,
where no C toolchain is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pandas as pd
import pytest

from engine.compiled import SOURCES_ENV_VAR
from experiments.cli.cmd_compile import HOT_MODULES, compile_modules, missing_toolchain

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    missing_toolchain() is not None, reason=f"cannot compile here: {missing_toolchain()}"
)

#: Tests that replace methods of core objects (compiled classes do not allow that) or deep-copy
#: a whole engine core (compiled classes do not support copy); everything else runs compiled.
PATCHING_TESTS = (
    "test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request",
    "test_bulk_run_equals_step_by_step",
    "test_every_kind_of_run_is_compared",
    "test_admission_precheck_refuses_only_what_the_plan_refuses",
    "test_simulator_drives_the_core_scheduler_step_for_step",
    "test_no_run_is_searched_for_when_the_next_arrival_is_within_a_step",
    "test_a_run_is_not_set_up_only_where_the_plan_would_refuse_a_second_admission",
)

#: A small run that exercises chunked prefill, async scheduling, prefix hits and preemption.
SIM_ARGS = [
    "simulate", "--no-plots", "--no-progress", "--seed", "3",
    "--dataset-name", "prefix_repetition", "--num-prompts", "200", "--request-rate", "40",
    "--max-num-batched-tokens", "1024", "--num-gpu-blocks-override", "400",
]


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(root), TWINSERVE_TEST_COMPILED="1")
    env.pop("PYTEST_ADDOPTS", None)
    env.pop(SOURCES_ENV_VAR, None)  # the suite's own "run the sources" (tests/conftest.py)
    return env


def _python(root: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or root, env=_env(root), capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def compiled_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compiled")
    skip = shutil.ignore_patterns("__pycache__", "*.so", "_compiled.json", ".hypothesis")
    for name in ("engine", "sim", "workload", "experiments", "reports"):
        shutil.copytree(ROOT / name, root / name, ignore=skip)
    (root / "tests").mkdir()
    for name in ("__init__.py", "conftest.py"):
        shutil.copy(ROOT / "tests" / name, root / "tests" / name)
    for name in ("core", "sim", "golden"):
        shutil.copytree(ROOT / "tests" / name, root / "tests" / name, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    compile_modules(root)
    return root


def test_every_hot_module_is_imported_compiled(compiled_tree: Path, tmp_path: Path) -> None:
    # Installed (editable) runs have the packages, not the tree's root, on sys.path: every
    # extension (incl. mypyc's shared runtime library) must live inside a package.
    extensions = [p for p in compiled_tree.rglob("*.so") if "build" not in p.parts]
    assert extensions and all((p.parent / "__init__.py").exists() for p in extensions)
    proc = _python(compiled_tree, "-c", (
        "import json, sim.runtime, sim.cost.vllm_step, engine.compiled as c; "
        "print(json.dumps(c.loaded_compiled_modules()))"
    ), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    expected = sorted(m.removesuffix(".py").replace("/", ".") for m in HOT_MODULES)
    assert json.loads(proc.stdout) == expected


def test_golden_scheduler_and_event_log_tests_pass_compiled(
    compiled_tree: Path, tmp_path: Path
) -> None:
    deselect = " and ".join(f"not {name}" for name in PATCHING_TESTS)
    report = tmp_path / "junit.xml"
    proc = _python(
        compiled_tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", deselect,
        f"--junitxml={report}",
        "tests/core/test_golden_replay.py", "tests/core/test_scheduler.py",
        "tests/core/test_async_scheduler.py", "tests/core/test_scheduler_priority.py",
        "tests/core/test_kv_cache_manager.py", "tests/core/test_fast_forward.py",
        "tests/sim/test_event_log_exact.py", "tests/sim/test_runtime_properties.py",
        "tests/core/test_event_log_steps.py", "tests/core/test_event_log_runs.py",
        "tests/core/test_private_hashes.py",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    # the 81 golden workloads and the scheduler/KV/event-log tests, minus PATCHING_TESTS
    assert counts["tests"] >= 150 and counts["failures"] == counts["errors"] == 0, counts


def test_compiled_simulation_writes_the_same_run(compiled_tree: Path, tmp_path: Path) -> None:
    runs = {}
    for label, root in (("compiled", compiled_tree), ("python", ROOT)):
        out = tmp_path / label
        # the sources of this tree (even where `make demo` compiled it), the copy's build
        env = dict(os.environ, PYTHONPATH=str(root))
        if label == "compiled":
            env.pop(SOURCES_ENV_VAR, None)
        proc = subprocess.run(
            [sys.executable, "-m", "experiments.cli", *SIM_ARGS, "--out", str(out)],
            cwd=root, env=env, capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr
        runs[label] = out
    meta = json.loads((runs["compiled"] / "config.json").read_text())
    assert meta["compiled_modules"] == len(HOT_MODULES)
    assert json.loads((runs["python"] / "config.json").read_text())["compiled_modules"] == 0
    for table in ("requests", "steps", "token_runs"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(runs["compiled"] / f"{table}.parquet"),
            pd.read_parquet(runs["python"] / f"{table}.parquet"),
        )
    compiled, python = (json.loads((runs[k] / "summary.json").read_text()) for k in runs)
    for provenance in ("date", "git_commit"):  # the copy is not a git checkout
        compiled.pop(provenance, None)
        python.pop(provenance, None)
    assert compiled == python
    # the run covers what it claims: preemptions, chunked prefill, prefix hits, async
    # scheduling and bulk decode runs
    steps = pd.read_parquet(runs["python"] / "steps.parquet")
    assert steps["num_preempted_reqs"].sum() > 0 and steps["num_prefill_reqs"].gt(0).any()
    assert pd.read_parquet(runs["python"] / "requests.parquet")["prefix_hit_tokens"].sum() > 0
    assert meta["engine_config"]["scheduler"]["async_scheduling"]
    assert meta["stats"]["num_bulk_steps"] > 0


def test_an_edited_module_runs_the_whole_build_from_sources(compiled_tree: Path) -> None:
    """Edit one compiled module (in ``sim``): every module then runs from its source (they
    call each other natively), stderr says so once, and the repair commands still work."""
    source = compiled_tree / "sim" / "replica.py"
    original = source.read_text()
    source.write_text(original + "\n# edited after compiling\n")
    try:
        proc = _python(compiled_tree, "-c", (
            "import json, sim.runtime, sim.cost.vllm_step, engine.compiled as c; "
            "print(json.dumps(c.loaded_compiled_modules()))"
        ))
        states = _python(compiled_tree, "-m", "experiments.cli", "compile", "--status")
    finally:
        source.write_text(original)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert proc.stderr.count("sim/replica.py changed after the last `twinserve compile`") == 1
    assert states.returncode == 0, states.stderr
    assert "stale     sim/replica.py" in states.stdout
    assert "compiled  engine/core/scheduler.py" in states.stdout
    # restored: the build is fresh again and used
    proc = _python(compiled_tree, "-c", (
        "import json, sim.runtime, sim.cost.vllm_step, engine.compiled as c; "
        "print(json.dumps(c.loaded_compiled_modules()))"
    ))
    assert proc.returncode == 0 and len(json.loads(proc.stdout)) == len(HOT_MODULES)
    assert proc.stderr == ""
