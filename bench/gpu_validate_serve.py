"""The served-path validation on one H200: ``twinserve validate`` with a Llama-3.1-8B-shaped
model (random weights, bf16) behind ``twinserve serve``, in one process layout, in < 10 minutes.

Usage (repository root)::

    python -m bench.gpu_validate_serve              # CUDA: Llama-3.1-8B shape, bf16, dummy
    python -m bench.gpu_validate_serve --smoke      # CPU: the tiny model, ~30 s (CI check)
    python -m bench.gpu_validate_serve --check      # which packages this machine lacks

What runs is exactly ``twinserve validate`` (``experiments/validation/served.py``): one
``twinserve serve`` (one API server, one EngineCore on CUDA; the EngineCore, the API server and
the load generator pinned to CPUs 0, 1 and 2), the ``gpu`` grid profiled inside the EngineCore
process (prefills up to 8192 tokens, decodes up to 256 × 2048), calibration runs at
concurrency 1, 8, 32 and 128, the capacity burst, then 200 requests (512 ± 256 prompt tokens,
128 ± 64 output tokens, Poisson) at 15%, 50% and 85% of the measured capacity, each twice; the
fitted and the replayed-steps simulations of each stream. Budget on an H200: server start and
profile ≈ 2 min, calibration and capacity ≈ 1 min, measured runs ≈ 2 min, simulations and
reports < 1 min.

The device image has torch, Triton, pandas, pyarrow, matplotlib, prometheus-client, uvloop
and jinja2 but not the serving stack nor simpy: carry these wheels (the versions pinned in
``pyproject.toml``; ``--check`` lists what is missing) and install them first —
fastapi, starlette, pydantic, pydantic-core, annotated-types, typing-inspection,
typing-extensions, uvicorn, httptools, pyzmq, msgspec, simpy.

It writes to ``--out`` (default ``$OUT``, else ``gpu_validate_serve_out``) seven files, none
nested (a device run brings back at most eight): ``validation.md``,
``validation_summary.json``, ``profile.csv``, ``profile.meta.json``, ``profile.fitted.json``,
``served_costs.json`` and ``runs.tar.gz`` (every run directory, the server's records and step
shapes), and prints the error table last.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.gpu_real_smoke import LLAMA_31_8B

#: import name -> distribution, of what validate needs beyond torch.
NEEDED = {"fastapi": "fastapi", "starlette": "starlette", "pydantic": "pydantic",
          "uvicorn": "uvicorn", "httptools": "httptools", "zmq": "pyzmq",
          "msgspec": "msgspec", "prometheus_client": "prometheus-client", "simpy": "simpy",
          "pandas": "pandas", "pyarrow": "pyarrow", "matplotlib": "matplotlib",
          "jinja2": "jinja2", "tokenizers": "tokenizers"}
COPIED = ("validation.md", "validation_summary.json", "profile.csv", "profile.meta.json",
          "profile.fitted.json", "served_costs.json")


def missing_packages() -> list[str]:
    out = []
    for module, dist in NEEDED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            out.append(dist)
    return out


def validate_flags(model_dir: str, work: Path, smoke: bool) -> list[str]:
    """``twinserve validate``'s command line for the GPU run, or its CPU smoke."""
    common = ["validate", "--model", model_dir, "--out", str(work), "--no-plots",
              "--repeats", "2"]
    if smoke:
        return [*common, "--device", "cpu", "--kv-cache-memory", "2MiB", "--grid", "quick",
                "--calibration", "2", "--num-prompts", "8", "--random-input-len", "24",
                "--random-output-len", "6", "--loads", "0.5"]
    return [*common, "--device", "cuda", "--dtype", "bfloat16", "--load-format", "dummy",
            "--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--max-num-seqs", "256",
            "--gpu-memory-utilization", "0.85", "--grid", "gpu", "--calibration", "1,8,32,128",
            "--num-prompts", "200", "--random-input-len", "512", "--random-output-len", "128",
            "--random-range-ratio", "0.5", "--loads", "0.15,0.5,0.85"]


def make_model(root: Path, smoke: bool) -> str:
    if smoke:
        from engine.worker.tiny_model import TinyModelSpec, make_tiny_model

        return str(make_tiny_model(root / "tiny", TinyModelSpec(arch="llama")))
    (root / "config.json").write_text(json.dumps(LLAMA_31_8B))
    return str(root)


def bring_back(work: Path, out: Path) -> list[str]:
    """The few files a device run returns (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for name in COPIED:
        if (work / name).exists():
            shutil.copy2(work / name, out / name)
            names.append(name)
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        for path in sorted(work.iterdir()):
            if path.name not in COPIED:
                tar.add(path, arcname=path.name)
    return [*names, "runs.tar.gz"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="the tiny model on CPU (CI check)")
    p.add_argument("--check", action="store_true", help="list missing packages and exit")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu_validate_serve_out")
    args = p.parse_args(argv)
    missing = missing_packages()
    if args.check or missing:
        print("missing: " + (", ".join(missing) or "nothing"))
        return 1 if missing else 0
    from experiments.cli import main as twinserve

    out = Path(args.out)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-validate-") as tmp:
        work = Path(tmp) / "validate"
        flags = validate_flags(make_model(Path(tmp), args.smoke), work, args.smoke)
        print("twinserve " + " ".join(flags), file=sys.stderr)
        status = twinserve(flags)
        if work.exists():
            names = bring_back(work, out)
            print(f"brought back {', '.join(names)} to {out}", file=sys.stderr)
    print(f"done in {time.perf_counter() - t0:.0f} s (status {status})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
