"""Benchmark: the whole ``twinserve simulate … --no-plots`` command on reference workloads.

* ``vidur-stream`` — the request stream ``bench/data/vidur_stream_conv_qps0.75_n10000.csv``
  (arrivals and lengths of 10,000 Azure-conversation requests) on Llama-2-70B, TP 2, A100 80GB,
  token budget 512, max_num_seqs 128 (Vidur's reference stream; ``--peer`` runs Vidur beside it).
* ``million`` — 1,000,000 requests with Azure-conversation lengths at 20 req/s on Llama-3.1-8B,
  one H100 (vLLM's online defaults), to check that memory stays bounded.
* ``mooncake`` — the whole Mooncake conversation trace (12,031 requests, prompts of 12k tokens
  on average sharing prefixes, at the trace's own times) on Llama-3.1-8B, one H100, prefix
  caching on: a queue held back by KV memory, and the KV cache's per-block work (allocation,
  prefix hashes, frees), where the million-request case is mostly per-request work.
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

``--peer CMD`` measures a peer simulator side by side: its shell command (Vidur on the same
stream, say: docs/simulator.md gives one) runs before or after each repeat of the case, turn
about, and the benchmark prints its row and, at the end, the median and range of the paired
ratio of CPU times, peer over ours — the figure that survives the machine's drift.

Usage: python -m bench.simulator [vidur-stream] [million] [mooncake] [fleet] [--repeat N]
[--num-prompts N] [--shards N] [--peer CMD]  (``--num-prompts`` shortens a case, for a quick
check; the figures quoted are of full cases.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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
    "mooncake": [
        "--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100-sxm",
        "--dataset-name", "trace", "--dataset-path", "mooncake-conversation",
        "--num-prompts", "12031",
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


@dataclass(frozen=True)
class Measured:
    """One command's cost: wall seconds, CPU seconds (user + sys of it and of every process it
    started and waited for) and the largest peak RSS among those processes, in MiB."""

    wall_s: float
    cpu_s: float
    peak_rss_mib: float


def measure(cmd: list[str] | str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` (an argument list, or a shell command line given as a string) and measure
    it with the process's own rusage (``wait4``), so that each command's peak is its own (on
    Linux it starts at this process's own peak: keep the benchmark's process small).
    A failing command raises ``SystemExit`` with the end of its standard error."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, shell=isinstance(cmd, str), cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: do not leave the command running
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-4000:]
            raise SystemExit(f"{cmd!r} failed (exit status {proc.returncode}):\n{tail}")
    return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def run_case(name: str, num_prompts: int | None = None, shards: int = 1) -> dict[str, float]:
    """Run case ``name`` (shortened to ``num_prompts`` requests if given; split over ``shards``
    processes) and measure it."""
    shorter = ["--num-prompts", str(num_prompts)] if num_prompts is not None else []
    split = ["--shards", str(shards)] if shards > 1 else []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "experiments.cli", "simulate", "--no-plots",
               "--no-progress", "--out", str(out), *CASES[name], *shorter, *split]
        cost = measure(cmd, cwd=ROOT, env=_env())
        meta = json.loads((out / "config.json").read_text())
    stats = meta["stats"]
    return {
        "wall_s": cost.wall_s,
        "cpu_s": cost.cpu_s,
        "requests": stats["num_requests"],
        "steps": stats["num_steps"],
        "bulk_share": stats["num_bulk_steps"] / max(stats["num_steps"], 1),
        "sim_wall_s": stats["wall_time_s"],
        "simulated_s": stats["duration_s"],
        "peak_rss_mb": cost.peak_rss_mib,
        "compiled_modules": meta["compiled_modules"],
    }


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


HEADER = (f"{'case':<14} {'wall s':>7} {'CPU s':>7} {'sim-loop s':>10} {'req/s':>9} "
          f"{'steps/s':>10} {'bulk':>5} {'steps':>9} {'simulated s':>12} {'peak RSS MB':>11} "
          f"{'compiled':>8}")


def _print_case(name: str, r: dict[str, float]) -> None:
    print(f"{name:<14} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} {r['sim_wall_s']:>10.2f} "
          f"{r['requests'] / r['wall_s']:>9.0f} {r['steps'] / r['wall_s']:>10.0f} "
          f"{r['bulk_share']:>5.0%} {r['steps']:>9.0f} {r['simulated_s']:>12.0f} "
          f"{r['peak_rss_mb']:>11.0f} {r['compiled_modules']:>8}", flush=True)


def _print_peer(m: Measured) -> None:
    dash = "-"
    print(f"{'peer':<14} {m.wall_s:>7.2f} {m.cpu_s:>7.2f} {dash:>10} {dash:>9} {dash:>10} "
          f"{dash:>5} {dash:>9} {dash:>12} {m.peak_rss_mib:>11.0f} {dash:>8}", flush=True)


def run_side_by_side(name: str, peer: str, repeat: int, num_prompts: int | None,
                     shards: int) -> list[float]:
    """``repeat`` pairs of the case and the ``peer`` shell command (ours first in even pairs,
    the peer first in odd ones), after one unmeasured run of the peer (its caches, its
    bytecode); prints every row and returns the paired CPU ratios, peer over ours."""
    measure(peer, env=_env())
    ratios: list[float] = []
    for i in range(repeat):
        if i % 2 == 0:
            ours = run_case(name, num_prompts, shards)
            _print_case(name, ours)
            theirs = measure(peer, env=_env())
            _print_peer(theirs)
        else:
            theirs = measure(peer, env=_env())
            _print_peer(theirs)
            ours = run_case(name, num_prompts, shards)
            _print_case(name, ours)
        ratios.append(theirs.cpu_s / ours["cpu_s"])
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help=f"{' and/or '.join(CASES)} (default: vidur-stream)")
    parser.add_argument("--repeat", type=_positive, default=1,
                        help="runs of each case (with --peer: pairs; default 1)")
    parser.add_argument("--num-prompts", type=_positive, help="shorten each case to N requests")
    parser.add_argument("--shards", type=_positive, default=1,
                        help="split each run over N processes (fleet: -dp 4 round robin)")
    parser.add_argument("--peer", metavar="CMD",
                        help="a peer simulator's shell command for the same workload, run turn "
                        "about with each repeat of the (one) case; prints the paired CPU ratio")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; valid: {', '.join(CASES)}")
    if not args.cases:
        args.cases = ["vidur-stream"]
    if args.peer is not None and (len(args.cases) > 1 or not args.peer.strip()):
        parser.error("--peer takes a command, and compares it with one case")
    warm_up()
    print(HEADER)
    for name in args.cases:
        if args.peer is None:
            for _ in range(args.repeat):
                _print_case(name, run_case(name, args.num_prompts, args.shards))
            continue
        ratios = run_side_by_side(name, args.peer, args.repeat, args.num_prompts, args.shards)
        print(f"CPU time, peer / {name}: median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}x, {len(ratios)} pairs)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
