"""GPU half of the simulator's validation: profile and measure on an H200, simulate at home.

Usage (repository root)::

    python -m bench.gpu_validate                   # CUDA: Llama-3.1-8B shape, bf16, dummy
    python -m bench.gpu_validate --smoke           # CPU: tiny model, seconds (CI check)
    twinserve validate --reuse-measured OUT --out OUT/validation   # later, where simpy is

The GPU image has torch and Triton but no simulator (no simpy), so this script does what needs
the GPU and saves it to ``--out`` (default ``$OUT``, else ``gpu_validate_out``), at most seven
files, none nested:

1. ``profile.csv``, ``profile.meta.json``, ``profile.fitted.json`` — the step-time grid on the
   GPU (``experiments.validation.profiling.profile_engine``, grid ``gpu``), the front-end and
   engine-loop CPU costs (a calibration run of the real loop), and the cost model fitted to them;
2. ``measured_<load>.json`` for loads 0.15, 0.5 and 0.85 of the engine's capacity, measured
   by a short saturation run (``experiments.validation.runs.measure_capacity_rps``) — each one
   measured run as a bundle (metadata, event log, every step's batch shape and measured time;
   ``experiments.validation.runs.write_bundle``).

It prints, last, a table per load: request rate, engine-side median/p99 TTFT, median measured
step time and the fitted model's error on that run's own steps. Where the simulator is
importable (``--smoke`` here) it then runs ``twinserve validate --reuse-measured`` on its own
output and prints the simulated-vs-measured error table instead. Budget: model build ≈ 1 min,
grid ≈ 1–2 min, calibration and three runs of 300 requests ≈ 2 min: well under 8 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_real_smoke import LLAMA_31_8B

LOADS = (0.15, 0.5, 0.85)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU (CI check)")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu_validate_out")
    p.add_argument("--num-prompts", type=int, default=None, help="requests per load")
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--loads", default=",".join(map(str, LOADS)))
    p.add_argument("--no-simulate", action="store_true",
                   help="do not run the simulator even where it is importable")
    args = p.parse_args(argv)
    big = not args.smoke
    args.num_prompts = args.num_prompts or (300 if big else 8)
    args.input_len = args.input_len or (512 if big else 32)
    args.output_len = args.output_len or (128 if big else 8)
    return args


def engine_args(model_dir: str, smoke: bool) -> Any:
    from engine.llm import EngineArgs

    if smoke:
        return EngineArgs(model=model_dir, device="cpu", kv_cache_memory=4 << 20,
                          max_model_len=512)
    return EngineArgs.from_kwargs(
        model_dir, device="cuda", dtype="bfloat16", load_format="dummy", max_model_len=16384,
        max_num_batched_tokens=8192, max_num_seqs=256, gpu_memory_utilization=0.9,
    )


def make_model(root: Path, smoke: bool) -> str:
    if smoke:
        from engine.worker.tiny_model import TinyModelSpec, make_tiny_model

        return str(make_tiny_model(root / "tiny", TinyModelSpec(arch="llama")))
    (root / "config.json").write_text(json.dumps(LLAMA_31_8B))
    return str(root)


def engine_side_ttft_ms(run: Any) -> tuple[float, float]:
    """(median, p99) of FIRST_TOKEN − ARRIVAL in the engine (no pandas needed)."""
    import numpy as np

    from engine.core.events import EventKind

    ev = run.log.events_columns()
    req, kind, t = (np.asarray(ev[k]) for k in ("req_index", "kind", "time_s"))
    arrival = {int(r): x for r, k, x in zip(req, kind, t, strict=True) if k == EventKind.ARRIVAL}
    first = [x - arrival[int(r)] for r, k, x in zip(req, kind, t, strict=True)
             if k == EventKind.FIRST_TOKEN]
    if not first:
        return math.nan, math.nan
    p50, p99 = np.percentile(np.asarray(first) * 1e3, [50, 99])
    return float(p50), float(p99)


def measured_table(rows: list[dict[str, Any]]) -> str:
    head = ("| load | rate (req/s) | requests | TTFT p50 (ms) | TTFT p99 (ms) | step p50 (ms) | "
            "step model |err| p50 | step model bias |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['load']} | {r['rate']:.2f} | {r['requests']} | {r['ttft_p50']:.1f} "
                     f"| {r['ttft_p99']:.1f} | {r['step_p50'] * 1e3:.2f} | "
                     f"{r['step_abs']:.1%} | {r['step_bias']:+.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    from experiments.run_meta import engine_config_dict
    from experiments.validation import profiling, runs
    from experiments.validation.report import step_time_errors
    from sim.cost.fitted import FittedCostModel
    from workload.build import build_workload
    from workload.config import WorkloadConfig

    if args.smoke:
        torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    loads = [float(x) for x in args.loads.split(",")]
    base = WorkloadConfig(dataset_name="random", num_prompts=args.num_prompts,
                          random_input_len=args.input_len, random_output_len=args.output_len,
                          random_range_ratio=0.5, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        eargs = engine_args(make_model(Path(tmp), args.smoke), args.smoke)
        calib = profiling.CalibrationSpec(
            concurrencies=(1, 4, 16) if args.smoke else (1, 8, 32, 128, 256),
            input_len=args.input_len, output_len=args.output_len)
        profiling.profile_engine(eargs, out / "profile.csv",
                                 grid="quick" if args.smoke else "gpu",
                                 calibration=calib, log=lambda s: print(s, file=sys.stderr))
        model = FittedCostModel.load(out / "profile.fitted.json")
        gc.collect()  # the profiling engine's weights go before the measured engine is sized
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        engine = eargs.build()
        model_capacity = runs.capacity_rps(model, build_workload(base),
                                           engine_config_dict(engine.engine_config))
        capacity = runs.measure_capacity_rps(engine, base)
        print(f"capacity: measured {capacity:.2f} req/s, fitted model {model_capacity:.2f}",
              file=sys.stderr)
        rows = []
        for frac in loads:
            cfg = dataclasses.replace(base, request_rate=frac * capacity)
            print(f"load {frac}: {cfg.request_rate:.2f} req/s (capacity {capacity:.2f})",
                  file=sys.stderr)
            run = runs.serve_measured(engine, cfg, model.measured_on.get("speed_probe_s"))
            run.meta.update(capacity_rps=capacity, load_fraction=frac,
                            model_capacity_rps=model_capacity)
            runs.write_bundle(run, out / f"measured_{frac:.2f}.json")
            shapes = runs.shapes_from_rows(run.step_rows)
            err = step_time_errors(model, shapes)
            ttft = engine_side_ttft_ms(run)
            rows.append({"load": frac, "rate": cfg.request_rate, "requests": cfg.num_prompts,
                         "ttft_p50": ttft[0], "ttft_p99": ttft[1],
                         "step_p50": float(np.median([s.execute_time_s for s in shapes])),
                         "step_abs": err["median_abs_rel_err"], "step_bias": err["median_rel_err"]})
        engine.executor.shutdown()
    print(f"fit (held-out rows): {json.dumps(model.fit_report.get('holdout'))}")
    print(f"done in {time.perf_counter() - t0:.0f} s; files in {out}")
    print(measured_table(rows))
    if not args.no_simulate and _simulator_available():
        from experiments.cli.cmd_validate import main as validate

        print("\nsimulated vs measured (rel err):")
        return validate(["validate", "--reuse-measured", str(out), "--out", str(out / "validation"),
                    "--no-plots"])
    return 0


def _simulator_available() -> bool:
    try:
        import pandas  # noqa: F401
        import simpy  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
