"""Regenerate the shipped kernel tables from aiconfigurator-core's measured database.

Source: the ``aiconfigurator-core`` wheel (PyPI, Apache-2.0, NVIDIA): its
``aiconfigurator_core/systems/data/<system>/<op>/vllm/<version>/*.parquet`` hold kernel times
measured on real GPUs through vLLM's own layers, under CUDA-graph replay (no host launch cost
included). Latencies there are milliseconds; the tables written here are microseconds
(``*_us``) rounded to 4 significant digits. Only the vLLM backend's tables are read, plus the
backend-neutral NCCL tables.

Run (needs ``pip install aiconfigurator-core==0.12.0 pyyaml``; not a dependency of twinserve)::

    python -m sim.cost.calibration.aic_extract [--out DIR] [--gpus h100_sxm,...]

Tables (``sim/data/kernels/aiconfigurator/``):

* ``gemm.csv`` — wide: gpu, dtype (bfloat16 | fp8 = per-tensor W8A8 CUTLASS), n, k, then one
  column per token count m (``m<M>_us``); y[m, n] = x[m, k] · W[k, n] (n output features).
* ``attn_prefill.csv`` — wide: gpu, kv_dtype, head_dim, num_heads, num_kv_heads (per GPU),
  batch, then ``isl<S>_us``: ``batch`` sequences of S tokens prefilled from an empty cache in
  one attention call (full attention: a sliding window is priced as full attention over at
  most the window, ``sim/cost/vllm_step.py``).
* ``attn_decode.csv`` — wide: same keys, then ``kv<L>_us``: ``batch`` decodes, each attending
  to L keys (the database's ``step`` + 1).
* ``moe.csv``, ``mla_decode.csv``, ``mla_prefill.csv`` — the fused-MoE layer and DeepSeek's MLA
  attention module (``sim/cost/calibration/aic_moe_mla.py``).
* ``allreduce.csv`` — long: gpu, impl (``vllm_graph`` / ``vllm_eager``: vLLM's
  ``tensor_model_parallel_all_reduce`` captured in a CUDA graph / eager; ``nccl``), version,
  tp, elements, bytes (bf16/fp16: 2 per element), latency_us.
* ``nccl_collectives.csv`` — long: all_gather, reduce_scatter, alltoall (fp16).
* ``coverage.csv`` — provenance: table, source file, vLLM version, rows read and written,
  dtype and the kernel vLLM ran.

Kernel lanes: per GPU and KV dtype the attention lane with the most rows (vLLM's own selector
chose it at collection time), never the Triton fallback.
"""

from __future__ import annotations

import argparse
import glob
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from sim.cost.calibration.aic_io import Writer, pick, vkey, wide
from sim.cost.calibration.aic_moe_mla import extract_mla, extract_moe

OUT = Path(__file__).resolve().parents[2] / "data" / "kernels" / "aiconfigurator"
DEFAULT_GPUS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "l40s")

# -- grids kept (intersected with what each GPU's table holds) ----------------------------------
#: Token counts: every CUDA-graph tile boundary pair up to 257 (the padded decode sizes), then
#: the prefill range.
GEMM_M = (
    1, 2, 4, 8, 16, 17, 32, 33, 48, 49, 64, 65, 80, 81, 96, 97, 112, 113, 128, 129, 160, 161,
    192, 193, 224, 225, 256, 257, 384, 512, 513, 768, 1024, 1536, 2048, 3072, 4096, 8192,
    16384, 32768,
)
GEMM_NK = (512, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384,
           51200, 65536)
GEMM_DTYPES = ("bfloat16", "fp8")
#: (query heads, KV heads) per GPU at head_dim 128: GQA groups 1-12 at 1-8 KV heads (the
#: catalog models at TP 1-8 and their neighbours) and, for prefill, MHA.
ATTN_PAIRS = (
    (1, 1), (2, 1), (4, 1), (5, 1), (8, 1), (2, 2), (4, 2), (8, 2), (10, 2), (16, 2), (4, 4),
    (8, 4), (16, 4), (20, 4), (24, 4), (32, 4), (8, 8), (16, 8), (32, 8), (40, 8), (64, 8),
    (96, 8), (16, 16), (32, 32), (64, 64),
)
ATTN_HEAD_DIM = 128
#: gpt-oss's attention (head_dim 64, 64 query / 8 KV heads) at TP 1-8.
ATTN_PAIRS_64 = ((64, 8), (32, 4), (16, 2), (8, 1))


def _aic_root() -> Path:
    return Path(str(resources.files("aiconfigurator_core"))) / "systems"


def versions(root: Path) -> dict[str, str]:
    import yaml

    doc = yaml.safe_load((root / "query_versions.yaml").read_text())
    out = {"default": doc["defaults"]["vllm"]["current"]}
    for gpu, per in (doc.get("overrides") or {}).items():
        if per.get("vllm"):
            out[gpu] = per["vllm"]["current"]
    return out


def extract_gemm(w: Writer, data: Path, gpu: str, version: str) -> None:
    got = pick(data, gpu, "gemm", "gemm_perf.parquet", version)
    if not got:
        return
    path, v = got
    df = pd.read_parquet(path)
    n_read = len(df)
    df = df[df.gemm_dtype.isin(GEMM_DTYPES) & df.m.isin(GEMM_M) & df.n.isin(GEMM_NK)
            & df.k.isin(GEMM_NK)].copy()
    df["latency_us"] = df.latency * 1e3
    df = df.rename(columns={"gemm_dtype": "dtype", "kernel_source": "kernel"})
    df.insert(0, "gpu", gpu)
    for dtype, sub in df.groupby("dtype"):
        t = wide(sub, ["gpu", "dtype", "n", "k"], "m", "m")
        w.add("gemm", t, gpu, path, v, n_read, dtype=dtype,
              kernel=";".join(sorted(sub.kernel.unique())))


def default_attention_kernel(df: Any, kv_dtype: str) -> str | None:
    """The lane with the most rows for this KV dtype, never the Triton fallback."""
    sub = df[(df.kv_cache_dtype == kv_dtype) & (df.kernel_source != "vllm_triton_attn")]
    if sub.empty:
        return None
    return str(sub.kernel_source.value_counts().idxmax())


def attn_filter(df: Any) -> Any:
    """Full attention: the head_dim-128 pairs and gpt-oss's head_dim-64 pairs."""
    if "window_size" in df.columns:
        df = df[df.window_size == 0]
    pair = pd.Series(list(zip(df.num_heads, df.num_key_value_heads, strict=True)), df.index)
    d128 = (df.head_dim == ATTN_HEAD_DIM) & pair.isin(ATTN_PAIRS)
    d64 = (df.head_dim == 64) & pair.isin(ATTN_PAIRS_64)
    return df[d128 | d64]


def extract_attention(w: Writer, data: Path, gpu: str, version: str) -> None:
    for fname, name, col in (
        ("context_attention_perf.parquet", "attn_prefill", "isl"),
        ("generation_attention_perf.parquet", "attn_decode", "kv"),
    ):
        got = pick(data, gpu, "attention", fname, version)
        if not got:
            continue
        path, v = got
        raw = pd.read_parquet(path)
        parts = []
        for kv_dtype in sorted(raw.kv_cache_dtype.unique()):
            kernel = default_attention_kernel(raw, kv_dtype)
            if kernel is None:
                continue
            sub = raw[(raw.kv_cache_dtype == kv_dtype) & (raw.kernel_source == kernel)]
            parts.append(attn_filter(sub))
        if not parts:
            continue
        df = pd.concat(parts)
        df = df[df.isl <= 16384] if name == "attn_prefill" else df
        df = df.assign(latency_us=df.latency * 1e3, kv=df.step + 1)
        df = df.rename(columns={"kernel_source": "kernel", "kv_cache_dtype": "kv_dtype",
                                "num_key_value_heads": "num_kv_heads", "batch_size": "batch"})
        df.insert(0, "gpu", gpu)
        for kv_dtype, sub in df.groupby("kv_dtype"):
            t = wide(sub, ["gpu", "kv_dtype", "head_dim", "num_heads", "num_kv_heads", "batch"],
                     col, col)
            w.add(name, t, gpu, path, v, len(raw), dtype=kv_dtype,
                  kernel=";".join(sorted(sub.kernel.unique())))


def newest_nccl(data: Path, gpu: str) -> tuple[str, str] | None:
    best: tuple[str, str] | None = None
    for c in glob.glob(str(data / gpu / "comm" / "nccl" / "*" / "nccl_perf.parquet")):
        df = pd.read_parquet(c, columns=["op_name"])
        if (df.op_name == "all_reduce").any():
            v = Path(c).parent.name
            if best is None or vkey(v) > vkey(best[1]):
                best = (c, v)
    return best


def extract_comm(w: Writer, data: Path, gpu: str, version: str) -> None:
    got = pick(data, gpu, "comm", "custom_allreduce_perf.parquet", version,
               newest_not_after=True)
    if got:
        path, v = got
        df = pd.read_parquet(path)
        rows = [dict(gpu=gpu, impl=r.backend, version=v, tp=r.num_gpus,
                     elements=r.message_size, bytes=2 * r.message_size,
                     latency_us=r.latency * 1e3) for r in df.itertuples()]
        w.add("allreduce", pd.DataFrame(rows), gpu, path, v, len(df), dtype="bfloat16",
              kernel="tensor_model_parallel_all_reduce")
    nc = newest_nccl(data, gpu)
    if nc:
        path, v = nc
        df = pd.read_parquet(path)
        df = df[df.nccl_dtype == "half"]
        for name, sub in (("allreduce", df[df.op_name == "all_reduce"]),
                          ("nccl_collectives", df[df.op_name != "all_reduce"])):
            rows = [dict(gpu=gpu, **({"impl": "nccl"} if name == "allreduce"
                                     else {"op": r.op_name}),
                         version=v, tp=r.num_gpus, elements=r.message_size,
                         bytes=2 * r.message_size, latency_us=r.latency * 1e3)
                    for r in sub.itertuples()]
            w.add(name, pd.DataFrame(rows), gpu, path, v, len(df), dtype="float16",
                  kernel=f"nccl {v}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--gpus", default=",".join(DEFAULT_GPUS))
    args = ap.parse_args(argv)
    root = _aic_root()
    data = root / "data"
    vers = versions(root)
    w = Writer(Path(args.out), root)
    for gpu in (g for g in args.gpus.split(",") if g):
        v = vers.get(gpu, vers["default"])
        extract_gemm(w, data, gpu, v)
        extract_attention(w, data, gpu, v)
        extract_comm(w, data, gpu, v)
        extract_moe(w, data, gpu, v)
        extract_mla(w, data, gpu, v)
    w.flush()
    total = 0
    for f in sorted(Path(args.out).glob("*.csv")):
        size = f.stat().st_size
        total += size
        print(f"{f.name:24s} {size / 1024:8.1f} KiB")
    print(f"{'total':24s} {total / 1024:8.1f} KiB")


if __name__ == "__main__":
    main()
