"""The plan's outputs: one ranked row per candidate → plan.csv, plan.md, probes.csv.

Columns of a row (``plan_rows``):

* the candidate: ``candidate`` (label), ``gpu``, ``tensor_parallel_size``,
  ``pipeline_parallel_size``, ``data_parallel_size``, ``num_gpus`` and one column per knob;
* ``status``: "ok"; "unbounded" (met the SLOs up to the search's rate limit); "infeasible"
  (the SLOs are not met even at the lowest rate tried — the row still shows the best it
  reached); "invalid" (the layout cannot run, e.g. the model does not fit); "pruned" (the
  cost model's estimate ruled it out before any simulation; ``note`` says why); target mode
  also "over_max_replicas";
* the estimate (when made): ``est_capacity_rps``, ``est_tokens_per_s_per_gpu``,
  ``est_tokens_per_s_per_user``, ``est_limit`` (what bounds it);
* the search: ``max_rate`` (req/s, every seed passed), ``fail_rate``, ``resolution`` (relative
  bracket width), ``noise_lo``/``noise_hi`` (rates where seeds disagreed), ``probes``;
  ``attainment`` (lowest over seeds at ``max_rate``, or the best reached when infeasible) and
  the seed means of ``p99_ttft_ms``, ``p99_tpot_ms``, ``request_throughput`` there;
* ``max_rate_per_gpu``, ``gpu_hours_per_million_requests`` = num_gpus / (rate · 3600) · 1e6 and,
  with a price, ``usd_per_gpu_hour`` and ``usd_per_million_requests``;
* target mode: ``replica_max_rate`` (one replica's capacity, in place of ``max_rate``),
  ``target_rate``, ``replicas``, ``num_gpus`` = TP × replicas, the cost at the target rate;
  ``attainment`` and the p99s are then those of the chosen layout at the target rate.

Ranking: in target mode by GPUs needed, then cost, then rate per GPU (headroom); otherwise by
GPU-hours per million requests (equivalently, rate per GPU), then cost. Rows that cannot serve
come last.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.plan.planner import CandidateOutcome, Evaluator, PlanSpec, seeds_mean
from experiments.sweep.report import markdown_table

#: Statuses whose rows rank above the others.
SERVING: frozenset[str] = frozenset({"ok", "unbounded"})


def _row(spec: PlanSpec, ev: Evaluator, o: CandidateOutcome) -> dict[str, Any]:
    c = o.candidate
    row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu,
                           "tensor_parallel_size": c.tensor_parallel_size,
                           "pipeline_parallel_size": c.pipeline_parallel_size,
                           "data_parallel_size": c.data_parallel_size,
                           "expert_parallel": c.expert_parallel,
                           "quantization": c.quantization or "", "num_gpus": c.num_gpus}
    row.update({k: v for k, v in c.knobs})
    if o.estimate is not None:
        e = o.estimate
        row.update(est_capacity_rps=e.capacity_rps,
                   est_tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
                   est_tokens_per_s_per_user=e.tokens_per_s_per_user, est_limit=e.limit)
    if o.capacity is None:
        status = "pruned" if o.pruned else "invalid"
        return {**row, "status": status, "note": o.error}
    cap = o.capacity
    best = cap.best_probe
    records = ev.records.get((c, best.rate), [])
    band = cap.noise_band
    row.update({
        "status": cap.status,
        "max_rate": cap.max_rate,
        "fail_rate": cap.fail_rate,
        "resolution": cap.relative_width,
        "converged": cap.converged,
        "noise_lo": band[0] if band else math.nan,
        "noise_hi": band[1] if band else math.nan,
        "probes": len(cap.probes),
        "attainment": best.min_attainment,
        "rate_of_attainment": best.rate,
        "p99_ttft_ms": seeds_mean(records, "p99_ttft_ms"),
        "p99_tpot_ms": seeds_mean(records, "p99_tpot_ms"),
        "request_throughput": seeds_mean(records, "request_throughput"),
        "max_rate_per_gpu": cap.max_rate / c.num_gpus,
    })
    rate, gpus = cap.max_rate, c.num_gpus
    if spec.target_rate is not None:
        row["replica_max_rate"] = row.pop("max_rate")
        row.update(target_rate=spec.target_rate, replicas=o.replicas,
                   status=o.target_status or cap.status)
        if o.replicas is not None and o.target_probe is not None:
            layout = c.with_replicas(o.replicas)
            at_target = ev.records.get((layout, o.target_probe.rate), [])
            row.update(
                candidate=layout.label, data_parallel_size=o.replicas,
                num_gpus=layout.num_gpus, attainment=o.target_probe.min_attainment,
                rate_of_attainment=o.target_probe.rate,
                p99_ttft_ms=seeds_mean(at_target, "p99_ttft_ms"),
                p99_tpot_ms=seeds_mean(at_target, "p99_tpot_ms"),
                request_throughput=seeds_mean(at_target, "request_throughput"),
            )
            gpus = layout.num_gpus
        rate = spec.target_rate if row["status"] == "ok" else 0.0
    row["gpu_hours_per_million_requests"] = gpus / (rate * 3600) * 1e6 if rate > 0 else math.nan
    price = spec.gpu_prices.get(c.gpu)
    if price is not None:
        row["usd_per_gpu_hour"] = price
        row["usd_per_million_requests"] = row["gpu_hours_per_million_requests"] * price
    row["note"] = "; ".join(n for n in (_note(spec, row, best),
                                        short_run_note(records, best.rate)) if n)
    return row


#: A probe's arrivals should span this many mean request latencies, so that most requests
#: see the engine at its steady-state load rather than filling or draining it.
STEADY_SPANS = 3.0


def short_run_note(records: Sequence[Mapping[str, Any]], rate: float) -> str:
    """A warning when the probe at ``rate`` ended before its engine reached steady state.

    At ``rate`` req/s and a mean latency of ``W`` s the engine holds ``rate·W`` requests
    (Little's law); ``N`` prompts arrive in ``N/rate`` s. When that is under ``STEADY_SPANS·W``
    most requests arrived into a filling engine, and the SLOs hold at rates the deployment
    cannot sustain: the capacity is overstated.
    """
    latency_s = seeds_mean(records, "mean_e2el_ms") / 1000
    num = seeds_mean(records, "completed")
    if not records or not rate > 0 or not latency_s > 0 or math.isnan(num):
        return ""
    need = STEADY_SPANS * rate * latency_s
    if num >= need:
        return ""
    return (f"short run: {num:.0f} prompts arrive in {num / rate:.3g} s at {rate:.3g} req/s, "
            f"under {STEADY_SPANS:g}x the mean latency ({latency_s:.3g} s), so the engine never "
            f"reached steady state and the capacity is overstated; rerun with --num-prompts "
            f"{math.ceil(need / 100) * 100} or more")


def _note(spec: PlanSpec, row: Mapping[str, Any], best: Any) -> str:
    status = row["status"]
    slo = " ".join(f"{k}:{v:g}ms" for k, v in spec.slos_ms.items())
    if status == "infeasible":
        return (f"infeasible: {slo} at {spec.attainment:.1%} not met even at {best.rate:.3g} "
                f"req/s; best attainment {best.min_attainment:.1%} (p99 TTFT "
                f"{row['p99_ttft_ms']:.0f} ms, p99 TPOT {row['p99_tpot_ms']:.1f} ms)")
    if status == "unbounded":
        if not row.get("converged", True):
            return (f"still meets the SLOs at {row['max_rate']:.4g} req/s when the probe budget "
                    "ran out (raise --max-probes or --rate-start)")
        return f"meets the SLOs up to the search limit {row['max_rate']:.4g} req/s (--rate-max)"
    if status == "over_max_replicas":
        return (f"{spec.max_replicas} replicas do not serve {spec.target_rate:g} req/s "
                f"(attainment {row['attainment']:.1%})")
    if not row.get("converged", True):
        return "search stopped at max probes; see resolution"
    if not math.isnan(row["noise_lo"]):
        lo, hi = row["noise_lo"], row["noise_hi"]
        where = f"at {lo:.4g}" if lo == hi else f"between {lo:.4g} and {hi:.4g}"
        return f"capacity search: seeds disagree {where} req/s"
    return ""


def plan_rows(spec: PlanSpec, ev: Evaluator, outcomes: Sequence[CandidateOutcome]) -> pd.DataFrame:
    """The ranked plan table (see the module docstring)."""
    df = pd.DataFrame([_row(spec, ev, o) for o in outcomes])
    df["_serving"] = ~df["status"].isin(SERVING)
    if spec.target_rate is not None:
        df["_serving"] = df["status"] != "ok"
    cost = df.get("usd_per_million_requests", pd.Series(math.nan, index=df.index))
    gph = df.get("gpu_hours_per_million_requests", pd.Series(math.nan, index=df.index))
    df["_cost"], df["_gph"] = cost, gph
    df["_headroom"] = -df.get("max_rate_per_gpu", pd.Series(math.nan, index=df.index))
    by = (["_serving", "num_gpus", "_cost", "_headroom"] if spec.target_rate is not None
          else ["_serving", "_gph", "_cost"])
    df = df.sort_values(by, kind="stable", na_position="last").drop(
        columns=["_serving", "_cost", "_gph", "_headroom"])
    df.insert(0, "rank", range(1, len(df) + 1))
    return df.reset_index(drop=True)


def probe_rows(ev: Evaluator) -> pd.DataFrame:
    """One row per simulated seed of every probe (candidate, rate, seed, attainment …)."""
    rows = []
    for (c, rate), records in ev.records.items():
        for seed, r in zip(ev.spec.seeds[: len(records)], records, strict=True):
            rows.append({"candidate": c.label, "rate": rate, "seed": seed,
                         "attainment": _attainment(r), "p99_ttft_ms": r.get("p99_ttft_ms"),
                         "p99_tpot_ms": r.get("p99_tpot_ms"),
                         "request_throughput": r.get("request_throughput"),
                         "cache_key": r.get("cache_key")})
    return pd.DataFrame(rows).sort_values(["candidate", "rate", "seed"]) if rows else (
        pd.DataFrame(rows))


def _attainment(record: Mapping[str, Any]) -> float:
    from experiments.sweep.records import effective_attainment

    return effective_attainment(record)


#: Columns of plan.md and the printed table (those present).
SHOWN: tuple[str, ...] = (
    "rank", "candidate", "num_gpus", "status", "max_rate", "replica_max_rate",
    "max_rate_per_gpu", "est_capacity_rps", "target_rate", "attainment", "p99_ttft_ms",
    "p99_tpot_ms", "gpu_hours_per_million_requests", "usd_per_million_requests",
)


def shown(df: pd.DataFrame) -> pd.DataFrame:
    return df[[c for c in SHOWN if c in df]]


def write_plan(spec: PlanSpec, df: pd.DataFrame, probes: pd.DataFrame, out: Path,
               workload: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "plan.csv", index=False)
    probes.to_csv(out / "probes.csv", index=False)
    slo = ", ".join(f"{k} ≤ {v:g} ms" for k, v in spec.slos_ms.items())
    if spec.target_rate:
        mode = f"fewest GPUs serving **{spec.target_rate:g} req/s**"
    elif spec.num_gpus is not None:
        mode = (f"the best deployment of **{spec.num_gpus} GPUs** of one kind (highest "
                "request rate per layout; replicas fill the budget)")
    else:
        mode = "highest request rate per candidate"
    lines = [
        "# Capacity plan", "",
        f"- Goal: {mode}; SLOs {slo} for at least {spec.attainment:.1%} of requests "
        f"(every one of {len(spec.seeds)} seeds must meet it).",
        f"- Model and workload: {spec.base.get('model', 'default model')}; {workload}.",
        f"- Search: tolerance {spec.search.tolerance:.0%} of the rate, rates "
        f"{spec.search.rate_min:g}–{spec.search.rate_max:g} req/s.",
        "", markdown_table(shown(df)), "",
    ]
    notes = [f"- {r.candidate}: {r.note}" for r in df.itertuples() if getattr(r, "note", "")]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    (out / "plan.md").write_text("\n".join(lines))


def write_front(spec: PlanSpec, ev: Evaluator, deployment: Any, out: Path) -> str:
    """front.csv, front.png and plan.md's front and recommendation sections; returns the
    recommendation's text (empty without one)."""
    from experiments.plan.front import front_points, plot_front, serve_commands

    points = front_points(spec, ev)
    if points.empty:
        return ""
    points.to_csv(out / "front.csv", index=False)
    lines = ["", "## Pareto front (throughput per GPU vs tokens/s per user)", "",
             "Every probe is a point (`front.csv`); these met the SLOs and no other SLO-meeting "
             "point beats them on both axes. `front.png` also plots throughput per GPU against "
             "p99 TTFT.", ""]
    front = points[points["on_user_front"]].sort_values("tokens_per_s_per_user")
    cols = ["candidate", "rate", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "p99_ttft_ms",
            "p99_tpot_ms", "vllm_serve"]
    lines += [markdown_table(front[cols]), ""]
    text = ""
    star = None
    if deployment is not None:
        d = deployment
        vllm, twin = serve_commands(spec, d.unit, d.replicas)
        verdict = {"verified": "met the SLOs at the predicted rate",
                   "backed_off": "met the SLOs only below the predicted rate",
                   "failed": "missed the SLOs even 20% below the predicted rate"}[d.status]
        text = "\n".join([
            f"Recommended: {d.replicas} × [{d.unit.label}] = {d.num_gpus} GPUs; simulated as a "
            f"whole at {d.predicted_rate:.3g} req/s predicted: {verdict}"
            + (f" (met at {d.rate:.3g} req/s)" if d.status == "backed_off" else "") + ".",
            f"  {d.tokens_per_s_per_gpu:.0f} output tok/s per GPU, "
            f"{d.tokens_per_s_per_user:.1f} tok/s per user, p99 TTFT "
            f"{d.metric('p99_ttft_ms'):.0f} ms, p99 TPOT {d.metric('p99_tpot_ms'):.1f} ms",
            f"  vllm serve:      {vllm}",
            f"  twinserve serve: {twin}",
        ])
        lines += ["## Recommended deployment", "", "```", text, "```", ""]
        if d.records:
            star = (d.tokens_per_s_per_gpu, d.tokens_per_s_per_user, d.metric("p99_ttft_ms"))
    slo = " ".join(f"{k}≤{v:g}ms" for k, v in spec.slos_ms.items())
    title = (f"{spec.base.get('model', '')} — {slo} at {spec.attainment:.0%} "
             f"({len(points)} simulated points)")
    plot_front(points, out / "front.png", title, star)
    with (out / "plan.md").open("a") as f:
        f.write("\n".join(lines))
    return text
