"""Measure our real engine's step times on a GPU beside the simulator's prediction.

    python -m bench.gpu_step_times                     # CUDA: Llama-3.1-8B shape, bf16
    python -m bench.gpu_step_times --smoke             # CPU: tiny model, Triton interpreter
    python -m bench.gpu_step_times --json-out out.json

On one GPU (an H200 by default; ``--gpu`` names the catalog GPU to predict for) it:

1. builds our engine (``engine/worker``: PyTorch model, our Triton paged-attention kernels)
   on a Llama-3.1-8B-shaped model with random weights (no checkpoint, no network);
2. replays a grid of step shapes — decodes by batch and context, prefills by length, a chunk
   after a cached context, a mixed chunked-prefill step — with ``engine.worker.profiler``'s
   ``StepProfiler`` (warm-ups, repeats, shuffled rounds; the median is reported);
3. measures host constants of this machine with torch (CUDA only): the host time of one eager
   kernel launch, of one CUDA-graph replay (a captured chain of kernels) and the device time
   of the same chain eager vs replayed — the quantities ``sim/cost/host.py``'s ``HostCosts``
   holds as estimates;
4. prints, last, a table of every shape: measured ms, the simulator's vLLM-step prediction
   for this GPU (eager: our engine captures no CUDA graphs), the same with vLLM's default
   CUDA graphs, and the ratio measured / predicted.

Our engine is not vLLM: its attention kernels are ours and it runs eagerly, so the ratio shows
how far our engine is from vLLM's kernels, not the cost model's error; the shapes use the
same ``--explain-step`` syntax, so any row can be explained term by term. The whole run takes
about 2–4 minutes on an H200 (dummy weights load in seconds); ``--smoke`` runs the same path
on the CPU in well under a minute (the suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Llama-3.1-8B's config.json (random weights) and a tiny one of the same shape for --smoke
from bench.gpu_real_smoke import LLAMA_31_8B, TINY

#: The step grid, in ``--explain-step`` syntax.
GRID = (
    "decode:1x512", "decode:8x512", "decode:32x512", "decode:64x512", "decode:128x512",
    "decode:1x4096", "decode:32x4096", "decode:64x4096", "decode:128x2048",
    "prefill:128", "prefill:512", "prefill:2048", "prefill:4096", "prefill:512@3584",
    "prefill:512,decode:63x1024", "prefill:4x256",
)
SMOKE_GRID = ("decode:1x32", "decode:4x64", "prefill:48", "prefill:16@40", "prefill:24,decode:3x20")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--smoke", action="store_true",
                   help="CPU, tiny model, Triton interpreter (what the test suite runs)")
    p.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    p.add_argument("--gpu", default="h200-sxm", help="catalog GPU the prediction is for")
    p.add_argument("--repeats", type=int, default=None, help="timed replays per round")
    p.add_argument("--rounds", type=int, default=None, help="passes over the grid")
    p.add_argument("--json-out", help="also write every row (and the host constants) as JSON")
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    args.repeats = args.repeats or (1 if args.smoke else 5)
    args.rounds = args.rounds or (1 if args.smoke else 2)
    return args


def model_spec(config: dict[str, Any]) -> Any:
    """The simulator's ``ModelSpec`` of a config.json."""
    from sim.models import ModelSpec

    return ModelSpec(
        "bench/" + ("tiny" if config["hidden_size"] < 1024 else "llama-3.1-8b"),
        config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
        config["num_key_value_heads"], config["head_dim"], config["intermediate_size"],
        config["vocab_size"], config["max_position_embeddings"],
    )


def shape_specs(grid: tuple[str, ...]) -> list[Any]:
    """The profiler's ``ShapeSpec`` of each grid entry (decodes first, as the scheduler lists)."""
    from engine.worker.profiler import ShapeSpec
    from sim.cost.explain import parse_step

    out = []
    for spec in grid:
        shape = parse_step(spec)
        chunks = tuple(zip(shape.prefill_query_lens, shape.prefill_context_lens, strict=True))
        decodes = ((shape.decode_context_sum // shape.num_decode_reqs,) * shape.num_decode_reqs
                   if shape.num_decode_reqs else ())
        kind = "mixed" if chunks and decodes else ("prefill" if chunks else "decode")
        out.append(ShapeSpec(kind, chunks, decodes))
    return out


def predictions(config: dict[str, Any], gpu_name: str, shapes: list[Any]) -> list[tuple[float,
                                                                                       float]]:
    """(eager, default CUDA graphs) vLLM-step predictions in ms for each shape."""
    from sim.cost.cuda_graphs import CudaGraphPlan, capture_sizes
    from sim.cost.vllm_step import VllmStepCostModel
    from sim.hardware import get_gpu

    gpu, spec = get_gpu(gpu_name), model_spec(config)
    eager = VllmStepCostModel(spec, gpu, graphs=CudaGraphPlan(
        capture_sizes(1024, 8192, enforce_eager=True), 1024))
    graphs = VllmStepCostModel(spec, gpu)
    return [(eager.step_time(s.batch_shape()).total_s * 1e3,
             graphs.step_time(s.batch_shape()).total_s * 1e3) for s in shapes]


def host_constants(device: str) -> dict[str, float]:
    """Host µs of one eager launch and one graph replay, device µs per kernel eager vs graph."""
    import torch

    if not device.startswith("cuda"):
        return {}
    x = torch.zeros(256, device=device)
    chain = 200

    def run_chain() -> None:
        for _ in range(chain):
            x.add_(1.0)

    for _ in range(3):
        run_chain()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        run_chain()
    host_launch = (time.perf_counter() - t0) / (20 * chain)
    torch.cuda.synchronize()
    eager_device = _device_time(run_chain, 20) / chain
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_chain()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_chain()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        graph.replay()
    host_replay = (time.perf_counter() - t0) / 50
    torch.cuda.synchronize()
    graph_device = _device_time(graph.replay, 20) / chain
    return {
        "kernel_launch_us": host_launch * 1e6,
        "graph_replay_us": host_replay * 1e6,
        "eager_device_us_per_kernel": eager_device * 1e6,
        "graph_device_us_per_kernel": graph_device * 1e6,
        "kernels_in_graph": float(chain),
    }


def _device_time(fn: Any, repeats: int) -> float:
    """Seconds per call of ``fn`` on the GPU (CUDA events)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def measure(args: argparse.Namespace, config: dict[str, Any], grid: tuple[str, ...]) -> list[Any]:
    """ProfileRow of every grid shape on our engine."""
    from engine.llm import EngineArgs
    from engine.worker.profiler import ProfileGrid, StepProfiler, blocks_needed

    shapes = shape_specs(grid)
    budget = max(s.num_tokens for s in shapes)
    max_len = max(s.max_seq_len() for s in shapes) + 16
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        engine = EngineArgs.from_kwargs(
            tmp, load_format="dummy", device=args.device,
            dtype="float32" if args.smoke else "bfloat16",
            max_num_batched_tokens=budget, max_num_seqs=max(s.num_reqs for s in shapes),
            max_model_len=max_len, enable_prefix_caching=False,
            num_gpu_blocks=blocks_needed(shapes, 16) + 1,
        ).build()
        timing = ProfileGrid(warmup=1 if args.smoke else 2, repeats=args.repeats,
                             rounds=args.rounds, seed=0)
        return list(StepProfiler(engine.executor).measure(shapes, timing))


def table(grid: tuple[str, ...], rows: list[Any], preds: list[tuple[float, float]],
          gpu: str) -> str:
    lines = [f"| step | measured ms (ours) | predicted vLLM eager ms ({gpu}) | "
             "predicted vLLM graphs ms | measured / eager |", "|---|---|---|---|---|"]
    for spec, row, (eager, graphs) in zip(grid, rows, preds, strict=True):
        ms = row.stats.median_s * 1e3
        lines.append(f"| {spec} | {ms:.3f} | {eager:.3f} | {graphs:.3f} | {ms / eager:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    t0 = time.perf_counter()
    config = TINY if args.smoke else LLAMA_31_8B
    grid = SMOKE_GRID if args.smoke else GRID
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}  device {name}  model "
          f"{'tiny' if args.smoke else 'Llama-3.1-8B shape'} (random weights)", flush=True)
    host = host_constants(args.device)
    for key, value in host.items():
        print(f"host constant {key}: {value:.2f}", flush=True)
    rows = measure(args, config, grid)
    preds = predictions(config, args.gpu, shape_specs(grid))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "device": name, "gpu_predicted": args.gpu, "host_constants": host,
            "rows": [{"step": g, "measured_ms": r.stats.median_s * 1e3,
                      "p10_ms": r.stats.p10_s * 1e3, "p90_ms": r.stats.p90_s * 1e3,
                      "predicted_eager_ms": e, "predicted_graphs_ms": gr}
                     for g, r, (e, gr) in zip(grid, rows, preds, strict=True)],
        }, indent=2) + "\n")
    ratios = [r.stats.median_s * 1e3 / e for r, (e, _) in zip(rows, preds, strict=True)]
    print(f"\n{len(rows)} shapes in {time.perf_counter() - t0:.0f} s; median measured/eager "
          f"{statistics.median(ratios):.2f}\n")
    print(table(grid, rows, preds, args.gpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
