"""Benchmark: the whole ``twinserve simulate … --no-plots`` command on reference workloads.

* ``vidur-stream`` — the request stream ``bench/data/vidur_stream_conv_qps0.75_n10000.csv``
  (arrivals and lengths of 10,000 Azure-conversation requests) on Llama-2-70B, TP 2, A100 80GB,
  token budget 512, max_num_seqs 128 (Vidur simulated this very stream in ≈40 s on this machine).
* ``million`` — 1,000,000 requests with Azure-conversation lengths at 20 req/s on Llama-3.1-8B,
  one H100 (vLLM's online defaults), to check that memory stays bounded.
* ``fleet`` — a small fleet: 4 such replicas (``-dp 4``, round robin) at 20 req/s each, 80,000
  requests; with ``--shards N`` the command splits it over N worker processes (the records are
  the same), which measures how a fleet-day scales with workers.

Each case runs the CLI in a subprocess (so import time, the simulation and writing the run
directory all count; after one tiny warm-up run, so that Python's bytecode cache is in place as
in any user's shell) and prints wall time, CPU time (user + sys of the command and every process
it started and waited for: the report process, shard workers), simulated requests and engine
steps per wall second, the fraction of steps applied by the exact bulk path, the largest peak RSS
among the command's processes, and how many modules ran compiled (``twinserve compile``; 0 = the
Python sources). On a shared machine quote the CPU time: the wall time follows the load.

Usage: python -m bench.simulator [vidur-stream] [million] [fleet] [--repeat N] [--num-prompts N]
[--shards N]  (``--num-prompts`` shortens a case, for a quick check; the figures quoted are of
full cases.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIDUR_STREAM = Path(__file__).resolve().parent / "data" / "vidur_stream_conv_qps0.75_n10000.csv"

CASES: dict[str, list[str]] = {
    "vidur-stream": [
        "--model", "meta-llama/Llama-2-70b-hf", "--gpu", "a100-80gb",
        "--tensor-parallel-size", "2",
        "--max-num-batched-tokens", "512", "--max-num-seqs", "128",
        "--dataset-name", "trace",
        "--dataset-path", str(VIDUR_STREAM),
        "--num-prompts", "10000",
    ],
    "million": [
        "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm",
        "--dataset-name", "trace", "--dataset-path", "azure-conv",
        "--request-rate", "20", "--num-prompts", "1000000",
    ],
    "fleet": [
        "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm",
        "--dataset-name", "trace", "--dataset-path", "azure-conv",
        "--data-parallel-size", "4", "--router", "round_robin",
        "--request-rate", "80", "--num-prompts", "80000",
    ],
}


def _env() -> dict[str, str]:
    """The command's environment as a user's shell has it: Python caches bytecode (a session
    that sets PYTHONDONTWRITEBYTECODE would recompile every source module at each start)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def warm_up() -> None:
    """One tiny run first, so that the measured ones start from cached bytecode."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "experiments.cli", "simulate", "--no-plots", "--no-progress",
             "--out", str(Path(tmp) / "run"), "--num-prompts", "5"],
            cwd=ROOT, env=_env(), capture_output=True, check=True,
        )


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def run_case(name: str, num_prompts: int | None = None, shards: int = 1) -> dict[str, float]:
    """Run case ``name`` (shortened to ``num_prompts`` requests if given; split over ``shards``
    processes) and measure it."""
    shorter = ["--num-prompts", str(num_prompts)] if num_prompts is not None else []
    split = ["--shards", str(shards)] if shards > 1 else []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "experiments.cli", "simulate", "--no-plots",
               "--no-progress", "--out", str(out), *CASES[name], *shorter, *split]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stderr}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_mb = max(after.ru_maxrss, before.ru_maxrss) / 1024
        meta = json.loads((out / "config.json").read_text())
    stats = meta["stats"]
    return {
        "wall_s": wall,
        "cpu_s": _cpu_s(after) - _cpu_s(before),
        "requests": stats["num_requests"],
        "steps": stats["num_steps"],
        "bulk_share": stats["num_bulk_steps"] / max(stats["num_steps"], 1),
        "sim_wall_s": stats["wall_time_s"],
        "simulated_s": stats["duration_s"],
        "peak_rss_mb": peak_mb,
        "compiled_modules": meta["compiled_modules"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help=f"{' and/or '.join(CASES)} (default: vidur-stream)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, help="shorten each case to N requests")
    parser.add_argument("--shards", type=int, default=1,
                        help="split each run over N processes (fleet: -dp 4 round robin)")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; valid: {', '.join(CASES)}")
    if not args.cases:
        args.cases = ["vidur-stream"]
    warm_up()
    print(f"{'case':<14} {'wall s':>7} {'CPU s':>7} {'sim-loop s':>10} {'req/s':>9} "
          f"{'steps/s':>10} {'bulk':>5} {'steps':>9} {'simulated s':>12} {'peak RSS MB':>11} "
          f"{'compiled':>8}")
    for name in args.cases:
        for _ in range(args.repeat):
            r = run_case(name, args.num_prompts, args.shards)
            print(f"{name:<14} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} {r['sim_wall_s']:>10.2f} "
                  f"{r['requests'] / r['wall_s']:>9.0f} {r['steps'] / r['wall_s']:>10.0f} "
                  f"{r['bulk_share']:>5.0%} {r['steps']:>9.0f} {r['simulated_s']:>12.0f} "
                  f"{r['peak_rss_mb']:>11.0f} {r['compiled_modules']:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
