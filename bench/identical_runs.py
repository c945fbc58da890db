"""Check that two builds write identical run directories on a set of configurations.

Speed work must not change a single record. This runs ``twinserve simulate`` on each
configuration of ``CONFIGS`` (scheduling modes, chunking, prefix caching, priorities,
preemptions, data parallelism with each router, a closed loop, rejections, Mooncake, Vidur's
stream, both cost models) with two trees — a git revision (``--base``, default ``main``) and
this working tree — and compares the run directories: the three tables byte for byte (Parquet
files written by the same pyarrow are equal exactly when their data are), ``summary.json`` and
``config.json`` as JSON, ``report.md`` and ``report.html`` as text, all without the fields a
rerun changes anyway (date, git commit, wall time, how many modules ran compiled, the bulk
path's own counters). Where tables differ it names the columns and rows.

Both trees run from copies (the base from ``git archive``, this tree's tracked and untracked
files as they are now), from their Python sources unless ``--compiled`` builds each copy
first (``twinserve compile``, about a minute each on two cores).

Usage: python -m bench.identical_runs [--base REV] [--only NAME,…] [--compiled] [--keep DIR]
Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.output_dir import MANIFEST_NAME

ROOT = Path(__file__).resolve().parents[1]
VIDUR = "bench/data/vidur_stream_conv_qps0.75_n10000.csv"
_RANDOM = ["--dataset-name", "random", "--random-input-len", "1024", "--random-output-len", "128"]

#: name -> simulate flags (each run takes seconds).
CONFIGS: dict[str, list[str]] = {
    "default": ["--num-prompts", "1000"],
    "sync": ["--no-async-scheduling", "--num-prompts", "600"],
    "no-chunking": ["--no-enable-chunked-prefill", "--num-prompts", "600"],
    "no-prefix-caching": ["--no-enable-prefix-caching", "--num-prompts", "600"],
    "long-prefill-threshold": ["--long-prefill-token-threshold", "256",
                               "--max-num-batched-tokens", "1024", "--num-prompts", "600"],
    "priority": ["--scheduling-policy", "priority", *_RANDOM, "--request-rate", "30",
                 "--num-prompts", "500"],
    "preemptions": ["--dataset-name", "prefix_repetition", "--num-prompts", "400",
                    "--request-rate", "40", "--max-num-batched-tokens", "1024",
                    "--num-gpu-blocks-override", "400", "--seed", "3"],
    "sync-preemptions": ["--no-async-scheduling", "--dataset-name", "prefix_repetition",
                         "--num-prompts", "300", "--request-rate", "40",
                         "--num-gpu-blocks-override", "400", "--seed", "5"],
    "dp2-vllm": ["-dp", "2", *_RANDOM, "--request-rate", "40", "--num-prompts", "600"],
    "dp3-round-robin": ["-dp", "3", "--router", "round_robin", "--request-rate", "30",
                        "--num-prompts", "900"],
    "dp2-prefix-aware": ["-dp", "2", "--router", "prefix_aware",
                         "--dataset-name", "prefix_repetition", "--request-rate", "20",
                         "--num-prompts", "500"],
    "dp2-least-kv-sync": ["-dp", "2", "--router", "least_kv", "--no-async-scheduling",
                          "--request-rate", "20", "--num-prompts", "500"],
    "closed-loop": ["--max-concurrency", "24", *_RANDOM, "--num-prompts", "400"],
    "rate-inf": [*_RANDOM, "--request-rate", "inf", "--num-prompts", "300"],
    "rejections": ["--dataset-path", "azure-code", "--max-model-len", "4096",
                   "--num-prompts", "600"],
    "mooncake": ["--dataset-path", "mooncake-conversation", "--num-prompts", "600"],
    "vidur-stream": ["--model", "meta-llama/Llama-2-70b-hf", "--gpu", "a100-80gb", "-tp", "2",
                     "--max-num-batched-tokens", "512", "--max-num-seqs", "128",
                     "--dataset-path", VIDUR, "--num-prompts", "1500"],
    "roofline": ["--cost-model", "roofline", "--num-prompts", "800"],
}

#: Fields a rerun of the same build changes (or that count the fast path's own work).
VOLATILE_KEYS = {"date", "git_commit", "compiled_modules", "wall_time_s", "num_bulk_steps",
                 "num_bulk_runs"}
_VOLATILE_TEXT = (re.compile(r"Date \S+"), re.compile(r"commit [0-9a-f]{7,40}( \(dirty\))?"))


def materialize_revision(rev: str, dest: Path) -> None:
    """The files of git revision ``rev`` in ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def materialize_worktree(dest: Path) -> None:
    """This tree's tracked and untracked (not ignored) files, as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _env(tree: Path, compiled: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), TWINSERVE_COMPILED="1" if compiled else "0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_tree(tree: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "compile"], cwd=tree,
                          env=_env(tree, True), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"compiling {tree} failed:\n{proc.stdout}{proc.stderr}")


def simulate(tree: Path, args: list[str], out: Path, compiled: bool) -> float:
    """Run one configuration in ``tree``; returns its wall time."""
    cmd = [sys.executable, "-m", "experiments.cli", "simulate", "--no-plots", "--no-progress",
           "--out", str(out), *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree, compiled), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {tree}:\n{proc.stderr}")
    return time.perf_counter() - start


def _drop_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_volatile(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_drop_volatile(v) for v in value]
    return value


def _mask_text(text: str) -> str:
    for pattern in _VOLATILE_TEXT:
        text = pattern.sub("…", text)
    return text


def _table_difference(a: Path, b: Path) -> str:
    """Which columns and how many rows of two tables differ (they are not byte-identical)."""
    import pandas as pd

    left, right = pd.read_parquet(a), pd.read_parquet(b)
    if list(left.columns) != list(right.columns) or len(left) != len(right):
        return (f"shape/columns differ: {left.shape} {list(left.columns)} vs {right.shape} "
                f"{list(right.columns)}")
    notes = []
    for col in left.columns:
        x, y = left[col], right[col]
        if x.dtype != y.dtype:
            notes.append(f"{col}: dtype {x.dtype} vs {y.dtype}")
            continue
        differ = ~((x == y) | (x.isna() & y.isna()))
        if differ.any():
            rows = differ.to_numpy().nonzero()[0]
            detail = ""
            if pd.api.types.is_float_dtype(x):
                detail = f", max |diff| {float((x - y).abs()[differ].max()):.3g}"
            notes.append(f"{col}: {len(rows)} rows (first {rows[0]}){detail}")
    return "; ".join(notes) or "same values, different bytes (metadata or categories)"


def compare_run_dirs(a: Path, b: Path) -> list[str]:
    """The differences between two run directories (empty: identical)."""
    out: list[str] = []
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists():
            out.append(f"{name}: only in {'base' if pa.exists() else 'new'}")
        elif pa.is_dir() or pb.is_dir():
            continue  # plots/: not written (--no-plots)
        elif name == MANIFEST_NAME:
            continue  # sizes and checksums of the files compared here, volatile ones included
        elif name.endswith(".parquet"):
            if pa.read_bytes() != pb.read_bytes():
                out.append(f"{name}: {_table_difference(pa, pb)}")
        elif name.endswith(".json"):
            ja, jb = (_drop_volatile(json.loads(p.read_text())) for p in (pa, pb))
            if ja != jb:
                keys = sorted(k for k in set(ja) | set(jb) if ja.get(k) != jb.get(k))
                out.append(f"{name}: differs in {', '.join(keys)}")
        elif _mask_text(pa.read_text()) != _mask_text(pb.read_text()):
            out.append(f"{name}: text differs")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", default="main", help="git revision to compare against")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(CONFIGS)}")
    parser.add_argument("--compiled", action="store_true", help="compile both copies first")
    parser.add_argument("--keep", type=Path, help="keep the copies and runs in this directory")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; valid: {', '.join(CONFIGS)}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="identical-runs-"))
    base_tree, new_tree = work / "base", work / "new"
    materialize_revision(args.base, base_tree)
    new_tree.mkdir(parents=True)
    materialize_worktree(new_tree)
    if args.compiled:
        for tree in (base_tree, new_tree):
            compile_tree(tree)
    build = "compiled" if args.compiled else "Python sources"
    print(f"base {args.base} vs this tree ({build}); {len(names)} configurations", flush=True)
    failed = 0
    try:
        for name in names:
            walls = []
            for label, tree in (("base", base_tree), ("new", new_tree)):
                walls.append(simulate(tree, CONFIGS[name], work / "runs" / name / label,
                                      args.compiled))
            diffs = compare_run_dirs(work / "runs" / name / "base", work / "runs" / name / "new")
            failed += bool(diffs)
            verdict = "identical" if not diffs else "DIFFERENT"
            print(f"{name:<24} {verdict:<10} (wall {walls[0]:.1f} s / {walls[1]:.1f} s)",
                  flush=True)
            for d in diffs:
                print(f"    {d}")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{len(names) - failed} of {len(names)} identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
