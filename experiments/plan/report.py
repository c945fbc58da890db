"""The plan's outputs: one ranked row per candidate → plan.csv, plan.md, probes.csv.

Columns of a row (``plan_rows``):

* the candidate: ``candidate`` (label), ``gpu``, ``tensor_parallel_size``,
  ``pipeline_parallel_size``, ``data_parallel_size``, ``num_gpus`` and one column per knob;
* ``status``: "ok"; "unbounded" (met the SLOs up to the search's rate limit); "infeasible"
  (the SLOs are not met even at the lowest rate tried — the row still shows the best it
  reached); "invalid" (the layout cannot run, e.g. the model does not fit); target mode also
  "over_max_replicas";
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
                           "data_parallel_size": c.data_parallel_size, "num_gpus": c.num_gpus}
    row.update({k: v for k, v in c.knobs})
    if o.capacity is None:
        return {**row, "status": "invalid", "note": o.error}
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
    row["note"] = _note(spec, row, best)
    return row


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
        for seed, r in zip(ev.spec.seeds, records, strict=True):
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
    "max_rate_per_gpu", "target_rate", "attainment", "p99_ttft_ms", "p99_tpot_ms",
    "gpu_hours_per_million_requests", "usd_per_million_requests",
)


def shown(df: pd.DataFrame) -> pd.DataFrame:
    return df[[c for c in SHOWN if c in df]]


def write_plan(spec: PlanSpec, df: pd.DataFrame, probes: pd.DataFrame, out: Path,
               workload: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "plan.csv", index=False)
    probes.to_csv(out / "probes.csv", index=False)
    slo = ", ".join(f"{k} ≤ {v:g} ms" for k, v in spec.slos_ms.items())
    mode = (f"fewest GPUs serving **{spec.target_rate:g} req/s**" if spec.target_rate
            else "highest request rate per candidate")
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
