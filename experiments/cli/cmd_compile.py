"""``twinserve compile``: build the simulator's hot modules as C extensions with mypyc.

The scheduler core and the simulator's engine loop are plain, fully typed Python. mypyc (part
of mypy, in the ``fast`` extra) compiles them unchanged into C extensions placed next to the
sources, where imports pick them up: same decisions, same records, a 2.4–5× faster
simulation loop (docs/simulator.md has the figures). It needs a C compiler and the Python
headers. The set-up (``make demo``) runs ``--auto``: it builds when the build is missing or
stale and, where it cannot build, says why in one line and succeeds (the sources run, same
results, slower). If a compiled module's source changes afterwards, ``engine/compiled.py`` runs the
sources of the whole build instead (and says so), so an edit is never silently ignored;
``--clean`` removes the build, ``--status`` lists what is compiled.

Not compiled: configuration and validation code (``engine/core/config.py``,
``sampling_params.py``: their error messages rely on Python's own type checks), and everything
outside the per-step path (reports, experiments, the real worker).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.compiled import (
    PACKAGES,
    compiled_on_disk,
    manifest_path,
    source_digest,
    stale_modules,
)
from engine.core.errors import UserError
from engine.process_guard import die_with_parent

ROOT = Path(__file__).resolve().parents[2]

#: The modules compiled, relative to the repository root: everything a simulated step runs.
HOT_MODULES: tuple[str, ...] = (
    "engine/core/block_pool.py",
    "engine/core/bulk/apply.py",
    "engine/core/bulk/find.py",
    "engine/core/bulk/records.py",
    "engine/core/bulk/run.py",
    "engine/core/bulk/shapes.py",
    "engine/core/chunking.py",
    "engine/core/engine_core.py",
    "engine/core/events.py",
    "engine/core/hashing.py",
    "engine/core/interfaces.py",
    "engine/core/kv_cache_manager.py",
    "engine/core/outputs.py",
    "engine/core/queues.py",
    "engine/core/request.py",
    "engine/core/scheduler.py",
    "engine/core/step_output.py",
    "engine/core/step_records.py",
    "sim/cost/attention.py",
    "sim/cost/interp.py",
    "sim/cost/roofline.py",
    "sim/cost/vllm_step.py",
    "sim/executor.py",
    "sim/replica.py",
    "sim/runtime.py",
    "sim/stages.py",
)

BUILD_DIR = "build/mypyc"

_SETUP = """
import sys
from mypyc.build import mypycify
from setuptools import setup

paths, jobs, build_dir = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
setup(
    name="twinserve-compiled",
    packages=[],
    # the shared runtime library goes inside engine/core (not at the top level, where only a
    # process started in the repository root could import it)
    ext_modules=mypycify(paths, opt_level="3", target_dir=build_dir,
                         group_name="engine.core._native"),
    script_args=["build_ext", "--inplace", "--parallel", jobs,
                 "--build-temp", build_dir + "/temp", "--build-lib", build_dir + "/lib"],
)
"""


def missing_toolchain() -> str | None:
    """Why compiling cannot work on this machine (None if it can)."""
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy: pip install -e '.[fast]')"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None and shutil.which("cc") is None:
        return f"no C compiler found (looked for {cc!r} and 'cc')"
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.exists():
        return f"the Python headers are missing ({include})"
    return None


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def clean(root: Path = ROOT, packages: Sequence[str] = PACKAGES) -> list[Path]:
    """Remove the compiled extensions (incl. mypyc's runtime library), the manifest and the
    build directory; returns the files removed. (mypy's cache ``.mypy_cache``, which the build
    shares with ``make lint``, stays.)"""
    removed: list[Path] = []
    for pkg in packages:
        d = root / pkg
        for f in sorted(d.iterdir()) if d.is_dir() else []:
            if f.suffix in (".so", ".pyd"):  # any interpreter's build (no other extensions here)
                f.unlink()
                removed.append(f)
    manifest = Path(manifest_path(str(root)))
    if manifest.exists():
        manifest.unlink()
        removed.append(manifest)
    shutil.rmtree(root / BUILD_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / BUILD_DIR).parent.rmdir()  # build/, if nothing else is in it
    return removed


def compile_modules(
    root: Path = ROOT, modules: Sequence[str] = HOT_MODULES, jobs: int | None = None
) -> float:
    """Build ``modules`` in place under ``root``; returns the build's wall time in seconds.

    Raises ``UserError`` when the toolchain is missing or the build fails (with its output's
    tail; nothing is left installed). The manifest holds the sources' digests as they were
    when the build *started*, so a file edited during the build counts as stale.
    """
    why = missing_toolchain()
    if why is not None:
        raise UserError(f"cannot compile: {why}; the Python sources keep working unchanged")
    outside = [m for m in modules if str(Path(m).parent) not in PACKAGES]
    if outside:
        raise UserError(f"cannot compile {outside}: only modules of {PACKAGES} may be compiled")
    clean(root)
    digests = {_module_name(m): source_digest(str(root / m)) for m in modules}
    jobs = jobs or os.cpu_count() or 1
    start = time.perf_counter()
    try:
        returncode, output = _build(root, modules, jobs)
    except BaseException:  # interrupted: stop the whole build, leave nothing half-built
        clean(root)
        raise
    if returncode != 0:
        clean(root)
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise UserError(f"mypyc build failed (nothing was installed):\n{tail}")
    Path(manifest_path(str(root))).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return time.perf_counter() - start


def _build(root: Path, modules: Sequence[str], jobs: int) -> tuple[int, str]:
    """Run the mypyc build in a process group of its own (the compiler processes it starts
    belong to it), so that an interruption stops every one of them; (exit status, output)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SETUP, ",".join(modules), str(jobs), BUILD_DIR],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=die_with_parent,
    )
    try:
        output, _ = proc.communicate()
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode, output


def status(
    root: Path = ROOT, modules: Sequence[str] = HOT_MODULES, packages: Sequence[str] = PACKAGES
) -> dict[str, str]:
    """{module path: "compiled" | "stale" | "python"} for each hot module, for this
    interpreter. Any "stale" one means the whole build runs from the sources."""
    on_disk = compiled_on_disk(str(root), packages)
    stale = set(stale_modules(str(root), packages))
    out: dict[str, str] = {}
    for m in modules:
        name = _module_name(m)
        out[m] = "stale" if name in stale else "compiled" if name in on_disk else "python"
    return out


def is_fresh(
    root: Path = ROOT, modules: Sequence[str] = HOT_MODULES, packages: Sequence[str] = PACKAGES
) -> bool:
    """Is every one of ``modules`` compiled for this interpreter, from its current source?"""
    return all(state == "compiled" for state in status(root, modules, packages).values())


def compile_if_needed(
    root: Path = ROOT,
    jobs: int | None = None,
    modules: Sequence[str] = HOT_MODULES,
    packages: Sequence[str] = PACKAGES,
) -> str:
    """``twinserve compile --auto`` (the set-up runs it): build unless a fresh build is there;
    never fails. Returns the one line to print: what was done, or why the Python sources run
    instead (same results, slower)."""
    if is_fresh(root, modules, packages):
        return f"compiled build up to date ({len(modules)} modules)"
    why = missing_toolchain()
    if why is not None:
        return (f"not compiling the simulator's hot modules ({why}): it runs from its Python "
                "sources (same results, slower)")
    print(f"compiling {len(modules)} modules with mypyc (about a minute on two cores)...",
          flush=True)
    try:
        seconds = compile_modules(root, modules, jobs=jobs)
    except UserError as exc:
        first = str(exc).splitlines()[0].rstrip(":")
        return (f"{first}: the simulator runs from its Python sources (same results, "
                "slower); `twinserve compile` shows the build's output")
    return f"compiled {len(modules)} modules in {seconds:.0f} s"


def _run(args: argparse.Namespace) -> int:
    if args.auto:
        print(f"twinserve: {compile_if_needed(jobs=args.jobs)}")
        return 0
    if args.clean:
        removed = clean()
        print(f"removed {len(removed)} compiled file(s); the Python sources are used")
        return 0
    if args.status:
        states = status()
        for module, state in states.items():
            print(f"{state:<9} {module}")
        if "stale" in states.values():
            print("stale modules: the Python sources of every module run until "
                  "`twinserve compile` rebuilds (or `--clean` removes) the build")
        return 0
    print(f"compiling {len(HOT_MODULES)} modules with mypyc (about a minute on two cores)...",
          flush=True)
    seconds = compile_modules(jobs=args.jobs)
    print(f"compiled in {seconds:.0f} s: {', '.join(HOT_MODULES)}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compile",
        help="build the simulator's hot modules with mypyc (optional, 2.4-5x faster loop)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--clean", action="store_true", help="remove the compiled modules")
    g.add_argument("--status", action="store_true", help="list compiled / stale / python")
    g.add_argument("--auto", action="store_true",
                   help="build unless a fresh build is there; where it cannot be built, say so "
                   "in one line and succeed (the sources run). The set-up (make demo) runs it")
    p.add_argument("--jobs", type=int, default=None, help="parallel C compiles (default: CPUs)")
    p.set_defaults(func=_run)
