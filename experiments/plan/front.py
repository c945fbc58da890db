"""The plan's Pareto fronts: throughput per GPU against tokens/s per user and against TTFT.

Every simulated probe is a point (``front_points``): one layout at one offered rate, with its
throughput per GPU, its per-user decode speed (1000 / mean TPOT ms) and its p99 TTFT (seed
means), and whether it met the SLOs (every seed passed). A point that met the SLOs served every
arrival, so its throughput is the offered rate × the mean output length (``served_throughput``:
the steady-state figure, which a finite run's measured output throughput understates by the
drain of its last requests); a point that did not is its measured output throughput. A point
is on the *user front* when no other SLO-meeting point has at least its throughput per GPU and
its tokens/s per user (one of them strictly more), on the *TTFT front* likewise with at most
its TTFT. ``front.csv`` holds every point with both flags and, for each, the ``vllm serve`` and
``twinserve serve`` command lines that deploy its layout (replicas of a dense engine, or one
data-parallel group for a MoE model, as vLLM's ``--data-parallel-size``); ``front.png`` plots
them (every point faint, SLO-meeting points by layout, both fronts as lines, the
recommendation starred).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.plan.planner import Candidate, Evaluator, PlanSpec, seeds_mean
from sim.model_catalog import get_model


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def serve_commands(spec: PlanSpec, c: Candidate, replicas: int) -> tuple[str, str]:
    """(``vllm serve``, ``twinserve serve``) command lines deploying ``replicas`` of ``c``."""
    base = spec.base
    model = str(base.get("model", "meta-llama/Llama-3.1-8B"))
    engine = dict(base.get("engine") or {})
    common: list[str] = [f"--tensor-parallel-size {c.tensor_parallel_size}"]
    if c.pipeline_parallel_size > 1:
        common.append(f"--pipeline-parallel-size {c.pipeline_parallel_size}")
    quant = c.quantization or base.get("quantization")
    if quant:
        common.append(f"--quantization {quant}")
    kv = base.get("kv_cache_dtype")
    if kv and kv != "auto":
        common.append(f"--kv-cache-dtype {kv}")
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if engine.get(key) is not None:
            common.append(f"{_flag(key)} {engine[key]}")
    for key, value in c.knobs:
        section, _, name = key.rpartition(".")
        if section == "engine" and name in ("max_num_seqs", "max_num_batched_tokens"):
            common.append(f"{_flag(name)} {value}")
    dp = c.data_parallel_size if c.data_parallel_size > 1 else replicas
    vllm = [f"vllm serve {model}", *common]
    if dp > 1:
        vllm.append(f"--data-parallel-size {dp}")
    if c.expert_parallel:
        vllm.append("--enable-expert-parallel")
    twin = [f"twinserve serve --emulate --model {model} --gpu {c.gpu}", *common]
    if c.expert_parallel:
        twin.append("--enable-expert-parallel")
    twin_text = " ".join(twin)
    moe = get_model(model).is_moe
    if moe and c.data_parallel_size > 1:
        twin_text = (f"(one emulated engine per server: the {c.data_parallel_size}-rank "
                     "data-parallel MoE group is not served by twinserve serve)")
    elif replicas > 1:
        twin_text = f"{replicas} × [{twin_text}] behind a load balancer"
    return " ".join(vllm), twin_text


def front_points(spec: PlanSpec, ev: Evaluator) -> pd.DataFrame:
    """Every simulated probe as a point, with the two front flags (module docstring)."""
    rows = []
    for (c, rate), records in sorted(ev.records.items(), key=lambda kv: (kv[0][0].label,
                                                                         kv[0][1])):
        if not records:
            continue
        tpot = seeds_mean(records, "mean_tpot_ms")
        passed = all(_attainment(r) >= spec.attainment for r in records)
        measured = seeds_mean(records, "output_throughput") / c.num_gpus
        served = served_throughput(records, rate) / c.num_gpus
        replicas = spec.replicas_in_budget(c)
        vllm, twin = serve_commands(spec, c, replicas)
        rows.append({
            "candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
            "pipeline_parallel_size": c.pipeline_parallel_size,
            "data_parallel_size": c.data_parallel_size, "expert_parallel": c.expert_parallel,
            "quantization": c.quantization or "", "num_gpus": c.num_gpus, "rate": rate,
            "seeds": len(records), "meets_slo": passed,
            "tokens_per_s_per_gpu": served if passed else measured,
            "measured_tokens_per_s_per_gpu": measured,
            "tokens_per_s_per_user": 1000.0 / tpot if tpot > 0 else math.nan,
            "p99_ttft_ms": seeds_mean(records, "p99_ttft_ms"),
            "p99_tpot_ms": seeds_mean(records, "p99_tpot_ms"),
            "attainment": min(_attainment(r) for r in records),
            "replicas_in_budget": replicas, "vllm_serve": vllm, "twinserve_serve": twin,
        })
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    ok = df["meets_slo"].to_numpy()
    y = df["tokens_per_s_per_gpu"].to_numpy()
    df["on_user_front"] = _pareto(ok, y, df["tokens_per_s_per_user"].to_numpy())
    df["on_ttft_front"] = _pareto(ok, y, -df["p99_ttft_ms"].to_numpy())
    return df


def served_throughput(records: Sequence[Mapping[str, Any]], rate: float) -> float:
    """Output tokens/s of serving every arrival at ``rate``: rate × mean output length."""
    outputs = seeds_mean(records, "total_output_tokens")
    done = seeds_mean(records, "completed")
    return rate * outputs / done if done > 0 else math.nan


def _attainment(record: Mapping[str, Any]) -> float:
    from experiments.sweep.records import effective_attainment

    return effective_attainment(record)


def _pareto(ok: Sequence[bool], y: Sequence[float], x: Sequence[float]) -> list[bool]:
    """Non-dominated among the ``ok`` points, maximising both ``x`` and ``y``."""
    out = []
    for i in range(len(y)):
        if not ok[i] or math.isnan(x[i]) or math.isnan(y[i]):
            out.append(False)
            continue
        beaten = any(ok[j] and j != i and y[j] >= y[i] and x[j] >= x[i]
                     and (y[j] > y[i] or x[j] > x[i]) for j in range(len(y)))
        out.append(not beaten)
    return out


def plot_front(df: pd.DataFrame, path: Path, title: str,
               recommended: tuple[float, float, float] | None = None) -> None:
    """``front.png``: throughput per GPU vs tokens/s per user and vs p99 TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    panels = (("tokens_per_s_per_user", "on_user_front", "tokens/s per user (1000 / mean TPOT)"),
              ("p99_ttft_ms", "on_ttft_front", "p99 TTFT (ms, log scale)"))
    for ax, (xcol, flag, xlabel) in zip(axes, panels, strict=True):
        ax.scatter(df[xcol], df["tokens_per_s_per_gpu"], s=14, c="0.8", label="probe (misses SLO)")
        ok = df[df["meets_slo"]]
        for label, sub in ok.groupby("candidate"):
            ax.scatter(sub[xcol], sub["tokens_per_s_per_gpu"], s=26, label=str(label))
        front = df[df[flag]].sort_values(xcol)
        ax.plot(front[xcol], front["tokens_per_s_per_gpu"], "k-", lw=1.5, label="Pareto front")
        if recommended is not None:
            x = recommended[1] if xcol == "tokens_per_s_per_user" else recommended[2]
            ax.scatter([x], [recommended[0]], marker="*", s=260, c="red", zorder=5,
                       label="recommended deployment")
        if xcol == "p99_ttft_ms":
            ax.set_xscale("log")  # missed probes' TTFTs run to tens of seconds
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output tokens/s per GPU")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
