"""Extract the fused-MoE and MLA-module tables from aiconfigurator-core's database.

Part of ``python -m sim.cost.calibration.aic_extract`` (same source, units and rounding):

* ``moe.csv`` — wide: gpu, dtype (bfloat16, fp8, fp8_block, w4a16_mxfp4), kernel, hidden,
  inter, topk, experts, moe_tp, moe_ep, then ``t<N>_us``: one rank's fused-MoE layer (routing,
  both grouped GEMMs, the weighted sum) for ``N`` tokens routed over all ``experts``, holding
  ``experts / moe_ep`` whole experts with ``inter / moe_tp`` of their width (vLLM's
  ``fused_experts`` with an expert map). Balanced routing only (every expert the same load),
  the shapes of the catalog's mixture-of-experts models.
* ``mla_decode.csv`` / ``mla_prefill.csv`` — wide: gpu, kv_dtype, gemm_type (bfloat16 or
  fp8_block projections), num_heads (per GPU), batch, then ``kv<L>_us`` (decodes attending to
  L cached tokens) or ``isl<S>_us`` (prompts of S tokens): DeepSeek-V3's whole attention module
  (projections, the latent KV cache, attention, output projection) as vLLM 0.24 builds it
  (``DeepseekV2MLAAttention``), whatever backend vLLM chose (FlashMLA, FlashAttention-MLA,
  FlashInfer-MLA; FlashAttention for long prefills).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sim.cost.calibration.aic_io import Writer, pick, wide

MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "w4a16_mxfp4")
#: MLA heads per GPU kept: DeepSeek-V3's 128 heads at TP 1-16.
MLA_HEADS = (8, 16, 32, 64, 128)
MLA_MODEL = "deepseek-ai/DeepSeek-V3"


def moe_shapes() -> set[tuple[int, int, int, int]]:
    """(hidden, expert width, top-k, experts) of every mixture-of-experts catalog model."""
    from sim.model_catalog import catalog

    return {(m.spec.hidden_size, m.spec.intermediate_size, m.spec.num_experts_per_token,
             m.spec.num_experts) for m in catalog().values() if m.spec.is_moe}


def extract_moe(w: Writer, data: Path, gpu: str, version: str) -> None:
    got = pick(data, gpu, "moe", "moe_perf.parquet", version)
    if not got:
        return
    path, v = got
    df = pd.read_parquet(path)
    n_read = len(df)
    shape = pd.Series(list(zip(df.hidden_size, df.inter_size, df.topk, df.num_experts,
                               strict=True)), df.index)
    df = df[shape.isin(moe_shapes()) & df.moe_dtype.isin(MOE_DTYPES)
            & (df.distribution == "balanced")].copy()
    if df.empty:
        return
    df = df.assign(latency_us=df.latency * 1e3).rename(columns={
        "moe_dtype": "dtype", "kernel_source": "kernel", "hidden_size": "hidden",
        "inter_size": "inter", "num_experts": "experts", "moe_tp_size": "moe_tp",
        "moe_ep_size": "moe_ep"})
    df.insert(0, "gpu", gpu)
    for dtype, sub in df.groupby("dtype"):
        t = wide(sub, ["gpu", "dtype", "kernel", "hidden", "inter", "topk", "experts", "moe_tp",
                       "moe_ep"], "num_tokens", "t")
        w.add("moe", t, gpu, path, v, n_read, dtype=dtype,
              kernel=";".join(sorted(sub.kernel.unique())))


def _mla_rows(path: str) -> Any:
    df = pd.read_parquet(path)
    keep = (df.model == MLA_MODEL) & df.num_heads.isin(MLA_HEADS) & (
        df.mla_dtype == "bfloat16") & df.gemm_type.isin(("bfloat16", "fp8_block"))
    return df[keep].rename(columns={"kv_cache_dtype": "kv_dtype", "batch_size": "batch"}), len(df)


def extract_mla(w: Writer, data: Path, gpu: str, version: str) -> None:
    for fname, name, col in (
        ("mla_generation_module_perf.parquet", "mla_decode", "kv"),
        ("mla_context_module_perf.parquet", "mla_prefill", "isl"),
    ):
        got = pick(data, gpu, "mla", fname, version)
        if not got:
            continue
        path, v = got
        df, n_read = _mla_rows(path)
        if df.empty:
            continue
        df = df.assign(latency_us=df.latency * 1e3, kv=df.step + 1)
        df.insert(0, "gpu", gpu)
        for (kv_dtype, gemm), sub in df.groupby(["kv_dtype", "gemm_type"]):
            t = wide(sub, ["gpu", "kv_dtype", "gemm_type", "num_heads", "batch"], col, col)
            w.add(name, t, gpu, path, v, n_read, dtype=f"{kv_dtype} KV, {gemm} GEMMs",
                  kernel=";".join(sorted(sub.kernel_source.unique())))
