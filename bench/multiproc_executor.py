"""What the multiprocess executor costs: step times through worker processes vs in-process.

    python -m bench.multiproc_executor                 # CPU: a small fp32 model, one rank
    python -m bench.multiproc_executor --tp 2          # CPU: also TP 2 (two worker processes)
    python -m bench.multiproc_executor --device cuda   # one GPU: Llama-3.1-8B shape, bf16
    python -m bench.multiproc_executor --smoke         # seconds, on CPU (the suite runs it)

It builds the same model (random weights, no checkpoint needed) twice — behind the in-process
``TorchExecutor`` (vLLM's uniprocess executor) and behind ``MultiprocExecutor`` with one worker
process (``--distributed-executor-backend mp``), both on the same device — and replays a grid
of step shapes on both with ``engine.worker.profiler``'s ``StepProfiler``, alternating the two
executors round by round so that both see the same machine (shared hosts drift). Each step
through the worker pays: pickling the scheduler output, one ZeroMQ IPC message per rank, the
worker's unpickling, and the sampled tokens' way back. The table gives each executor's median
step time, the difference (the executor's overhead per step) and its share of the step. With
``--tp 2`` a third column runs the model over two worker processes (gloo on CPU, nccl on CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

#: A small model whose CPU steps take milliseconds (not microseconds): the overhead shows
#: against realistic work.
SMALL: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8192,
    "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 0,
    "eos_token_id": 1,
}
GRID = ("decode:1x256", "decode:16x256", "decode:64x256", "prefill:128", "prefill:512",
        "prefill:128,decode:15x256")
SMOKE_GRID = ("decode:1x32", "decode:8x32", "prefill:32")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--tp", type=int, default=1, help="also time TP of this size (>1)")
    p.add_argument("--smoke", action="store_true", help="tiny model, few repeats (the suite)")
    p.add_argument("--rounds", type=int, default=None, help="alternations of the executors")
    p.add_argument("--repeats", type=int, default=None, help="timed replays per shape and round")
    p.add_argument("--json-out", help="also write the rows as JSON")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.smoke else 4)
    args.repeats = args.repeats or (2 if args.smoke else 5)
    return args


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.device.startswith("cuda"):
        from bench.gpu_step_times import LLAMA_31_8B

        return dict(LLAMA_31_8B)
    if args.smoke:
        from bench.gpu_step_times import TINY

        return dict(TINY)
    return dict(SMALL)


def build(model_dir: str, args: argparse.Namespace, num_blocks: int, backend: str,
          tp: int) -> Any:
    """The executor of one arm (the in-process one, or worker processes)."""
    from engine.core.config import SchedulerConfig
    from engine.core.parallel import ParallelConfig
    from engine.worker.config import WorkerConfig
    from engine.worker.executor import TorchExecutor
    from engine.worker.multiproc_executor import MultiprocExecutor

    worker = WorkerConfig(model_dir, device=args.device, load_format="dummy",
                          num_gpu_blocks_override=num_blocks)
    sched = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=128,
                            max_model_len=(num_blocks - 1) * 16)
    if backend == "uni":
        return TorchExecutor(worker, sched, 16)
    device_type = "cuda" if args.device.startswith("cuda") else "cpu"
    return MultiprocExecutor(worker, sched, 16, ParallelConfig(tensor_parallel_size=tp),
                             device_type=device_type, cpu_threads=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from bench.gpu_step_times import shape_specs

    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # both arms single-threaded: a fair CPU comparison
    from engine.worker.profiler import ProfileGrid, StepProfiler, blocks_needed

    grid = SMOKE_GRID if args.smoke else GRID
    shapes = shape_specs(grid)
    config = model_config(args)
    arms = [("in-process", "uni", 1), ("worker process", "mp", 1)]
    if args.tp > 1:
        arms.append((f"TP {args.tp} workers", "mp", args.tp))
    with tempfile.TemporaryDirectory(prefix="twinserve-mp-bench-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        num_blocks = blocks_needed(shapes, 16)
        executors = [build(tmp, args, num_blocks, backend, tp) for _, backend, tp in arms]
        try:
            medians = _measure(executors, shapes, args, ProfileGrid, StepProfiler)
        finally:
            for executor in executors:
                executor.shutdown()
        rows = _rows(grid, arms, medians)
        _add_hop_costs(rows, shapes, executors[0], StepProfiler)
        rows.append(_empty_round_trip(tmp, args, num_blocks))
    _print(rows, arms, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


def _measure(executors: list[Any], shapes: list[Any], args: argparse.Namespace,
             grid_cls: Any, profiler_cls: Any) -> list[list[float]]:
    """Median step time (s) per executor and shape, the executors alternating each round."""
    samples: list[list[list[float]]] = [[[] for _ in shapes] for _ in executors]
    profilers = [profiler_cls(e, vocab_size=e.model_config.vocab_size) for e in executors]
    for r in range(args.rounds):
        timing = grid_cls(warmup=1, repeats=args.repeats, rounds=1, seed=r)
        order = range(len(executors)) if r % 2 == 0 else reversed(range(len(executors)))
        for i in order:
            for j, row in enumerate(profilers[i].measure(shapes, timing)):
                samples[i][j].append(row.stats.median_s)
    return [[statistics.median(s) for s in per] for per in samples]


def _add_hop_costs(rows: list[dict[str, Any]], shapes: list[Any], executor: Any,
                   profiler_cls: Any) -> None:
    """Per step: the pickled scheduler output's size and the CPU time to pickle and unpickle
    it (what the hop adds besides the IPC message), measured here on a quiet thread."""
    import pickle
    import time

    import numpy as np

    profiler = profiler_cls(executor, vocab_size=executor.model_config.vocab_size)
    rng = np.random.default_rng(0)
    for row, spec in zip(rows, shapes, strict=True):
        _, replay, partial = profiler._schedules(spec, rng)
        out = profiler._replay(replay, partial)
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        times = []
        for _ in range(200):
            c0 = time.thread_time()
            pickle.loads(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
            times.append(time.thread_time() - c0)
        row["payload_bytes"] = len(data)
        row["pickle_cpu_us"] = statistics.median(times) * 1e6


def _empty_round_trip(model_dir: str, args: argparse.Namespace, num_blocks: int) -> dict[str, Any]:
    """Wall time of a step with nothing scheduled (no model work) through one worker process
    and in-process: the executor's fixed cost per step."""
    import time

    from engine.core.outputs import AdmissionBlocker, BatchShape, CachedRequestData, SchedulerOutput

    row: dict[str, Any] = {"step": "empty step (no model work)"}
    for name, backend in (("in-process", "uni"), ("worker process", "mp")):
        executor = build(model_dir, args, num_blocks, backend, 1)
        try:
            times = []
            for step in range(300):
                out = SchedulerOutput(step, [], CachedRequestData(), {}, 0, set(), set(), set(),
                                      BatchShape.empty(), AdmissionBlocker.NONE)
                t0 = time.perf_counter()
                executor.execute_model(out)
                times.append(time.perf_counter() - t0)
            row[name] = statistics.median(times[20:]) * 1e3
        finally:
            executor.shutdown()
    row["overhead_ms"] = row["worker process"] - row["in-process"]
    row["overhead_share"] = float("nan")
    return row


def _rows(grid: tuple[str, ...], arms: list[tuple[str, str, int]],
          medians: list[list[float]]) -> list[dict[str, Any]]:
    rows = []
    for j, spec in enumerate(grid):
        row: dict[str, Any] = {"step": spec}
        for (name, _, _), per in zip(arms, medians, strict=True):
            row[name] = per[j] * 1e3
        overhead = row["worker process"] - row["in-process"]
        row["overhead_ms"] = overhead
        row["overhead_share"] = overhead / row["worker process"]
        rows.append(row)
    return rows


def _print(rows: list[dict[str, Any]], arms: list[tuple[str, str, int]],
           args: argparse.Namespace) -> None:
    names = [a[0] for a in arms]
    print(f"median step time (ms), device {args.device}, {args.rounds} alternating rounds × "
          f"{args.repeats} repeats", file=sys.stderr)
    header = (f"{'step':<28}" + "".join(f"{n:>16}" for n in names)
              + f"{'overhead':>12}{'share':>8}{'bytes':>9}{'pickle µs':>11}")
    print(header)
    for row in rows:
        cells = "".join(f"{row[n]:>16.3f}" if n in row else f"{'':>16}" for n in names)
        share = row["overhead_share"]
        size = row.get("payload_bytes")
        print(f"{row['step']:<28}{cells}{row['overhead_ms']:>12.3f}"
              + (f"{share:>8.1%}" if share == share else f"{'':>8}")
              + (f"{size:>9}{row['pickle_cpu_us']:>11.1f}" if size is not None else ""))


if __name__ == "__main__":
    sys.exit(main())
