"""The validation report: per-metric relative errors, which stage misses, plots, Markdown.

Composes ``reports`` (tables, summaries, comparisons) with the fitted cost model's per-step
predictions; ``experiments.cli.cmd_validate`` drives it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))
#: The issue's accuracy targets: |rel err| of the median and of p99 of these metrics.
TARGETS = {"ttft": (0.05, 0.10), "tpot": (0.05, 0.10), "e2el": (0.05, 0.10)}


def step_time_errors(model: Any, samples: Sequence[Any]) -> dict[str, Any]:
    """Predicted vs measured step time on the measured run's own shapes (``StepSample``s)."""
    return _errors(_predicted(model, samples), _measured(samples))


def _predicted(model: Any, samples: Sequence[Any]) -> np.ndarray:
    return np.array([model.step_time(s.shape).total_s for s in samples], dtype=np.float64)


def _measured(samples: Sequence[Any]) -> np.ndarray:
    return np.array([s.execute_time_s for s in samples], dtype=np.float64)


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, Any]:
    if not len(meas):
        return {"num_steps": 0, "median_abs_rel_err": None, "median_rel_err": None,
                "total_rel_err": None}
    err = (pred - meas) / meas
    return {"num_steps": len(meas), "median_abs_rel_err": float(np.median(np.abs(err))),
            "p90_abs_rel_err": float(np.percentile(np.abs(err), 90)),
            "median_rel_err": float(np.median(err)),
            "total_rel_err": float((pred.sum() - meas.sum()) / meas.sum())}


def after_idle_steps(steps: Any, samples: Sequence[Any], model: Any,
                     idle_s: float = 1e-3) -> dict[str, Any]:
    """The steps that start after the loop sat idle (> ``idle_s`` since the previous step's
    outputs) vs the others: on a shared CPU the first steps after a sleep run with cold caches,
    which a profile of back-to-back steps never sees. ``with_wakeup_total_rel_err`` adds the
    fitted wake-up cost for each step's measured idle time, as the simulator does."""
    from sim.config import FrontendConfig

    st = steps.sort_values("step_id")
    end = st["delivered_time_s"].fillna(st["update_time_s"]).to_numpy()
    start = st["schedule_time_s"].to_numpy()
    ids = st["step_id"].to_numpy()
    gaps = dict(zip(ids[1:].tolist(), (start[1:] - end[:-1]).tolist(), strict=True))
    idle_ids = {i for i, gap in gaps.items() if gap > idle_s}
    wake = model.frontend.wakeup
    fe = FrontendConfig(idle_wakeup_s=wake.extra_s, idle_wakeup_ramp_s=wake.ramp_s)
    out: dict[str, Any] = {"wakeup_s": wake.extra_s, "wakeup_ramp_s": wake.ramp_s,
                           "wakeup_measured": wake.num_rows > 0}
    for name, group in (("after_idle", [s for s in samples if s.step_id in idle_ids]),
                        ("back_to_back", [s for s in samples if s.step_id not in idle_ids])):
        pred, meas = _predicted(model, group), _measured(group)
        err = _errors(pred, meas)
        wakeup = [fe.wakeup_s(gaps[s.step_id]) for s in group] if name == "after_idle" else 0.0
        out[name] = {"num_steps": err["num_steps"], "total_rel_err": err["total_rel_err"],
                     "median_rel_err": err["median_rel_err"],
                     "with_wakeup_total_rel_err": _errors(pred + wakeup, meas)["total_rel_err"],
                     "measured_median_s": _median(meas)}
    return out


def _wakeup_notes(idle: dict[str, Any]) -> list[str]:
    """What the steps after an idle loop say about the wake-up cost."""
    a, b = idle["after_idle"], idle["back_to_back"]
    if not a["num_steps"] or a["total_rel_err"] is None:
        return []
    seen = (f"Wake-up after idle: {a['num_steps']} steps start after the loop slept; the step "
            f"model alone is {a['total_rel_err']:+.1%} on them (measured median "
            f"{1e3 * a['measured_median_s']:.2f} ms) vs {_pct(b['total_rel_err'])} on "
            "back-to-back steps.")
    if idle.get("wakeup_measured"):
        return [f"{seen} With the profile's wake-up cost ({1e3 * idle['wakeup_s']:.2f} ms, "
                f"full after {1e3 * idle['wakeup_ramp_s']:.0f} ms asleep), which the simulator "
                f"adds to the first step after its loop idled, it is "
                f"{_pct(a['with_wakeup_total_rel_err'])}."]
    if b["total_rel_err"] is None or a["total_rel_err"] < b["total_rel_err"] - 0.05:
        return [f"{seen} This profile has no wake-up probe (profiled before it existed), so "
                "the simulator adds no wake-up cost and the first step of a request that "
                "finds the engine idle — its prefill, hence TTFT — is under-predicted at "
                "light load; profile again to measure it."]
    return []


def plot_step_scatter(model: Any, samples: Sequence[Any], png: Path) -> Path:
    from experiments.validation.profiling import step_kind
    from reports.plots import new_figure

    fig, axes = new_figure(1, 1, (6, 5.5), left=0.13, bottom=0.1)
    ax = axes[0, 0]
    groups = {"decode": [], "prefill": [], "mixed": []}  # type: dict[str, list[tuple[float, float]]]
    for sample in samples:
        s = sample.shape
        groups[step_kind(s)].append((sample.execute_time_s * 1e3, model.step_time(s).total_s * 1e3))
    lo, hi = math.inf, 0.0
    for kind, pts in groups.items():
        if pts:
            x, y = np.array(pts).T
            ax.scatter(x, y, s=8, alpha=0.5, label=f"{kind} ({len(pts)})")
            lo, hi = min(lo, x.min(), y.min()), max(hi, x.max(), y.max())
    if hi > 0:
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=1, label="predicted = measured")
        ax.fill_between(line, line * 0.9, line * 1.1, color="k", alpha=0.08, label="±10%")
        from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(StrMethodFormatter("{x:g}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("fitted model's prediction (ms)")
    ax.set_title("Per-step predicted vs measured (the run's own batch shapes)")
    ax.legend(fontsize=8)
    fig.savefig(png, dpi=110)
    return png


def _median(values: Any) -> float:
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if len(arr) else math.nan


#: request-path segments (reports.breakdown) grouped for the attribution of latency errors
SEGMENT_GROUPS: dict[str, tuple[str, ...]] = {
    "front end + engine pickup": ("client_to_frontend", "frontend_cpu", "ipc_in"),
    "scheduler wait": ("wait_token_budget", "wait_max_num_seqs", "wait_kv_cache",
                       "wait_preemption", "wait_policy", "wait_next_step"),
    "prefill steps": ("prefill",),
    "decode steps": ("decode",),
    "output (first token)": ("output_first",),
    "output (last token)": ("output_last",),
}


def stage_table(measured: Any, simulated: Any) -> list[tuple[str, float, float]]:
    """(stage, measured median, simulated median) in seconds (counts for the last rows)."""
    views = []
    for tables in (measured, simulated):
        st = tables.steps[tables.steps["num_tokens"] > 0]
        views.append({
            "model step (execute) time": _median(st["execute_end_s"] - st["execute_start_s"]),
            "schedule CPU per step": _median(st["execute_start_s"] - st["schedule_time_s"]),
            "post-step CPU (update + outputs)": _median(st["delivered_time_s"]
                                                        - st["execute_end_s"]),
            "loop period (schedule to schedule)": _median(np.diff(st["schedule_time_s"])),
            "steps with tokens (count)": float(len(st)),
            "mean scheduled requests per step": float(st["num_reqs"].mean()),
        })
    return [(name, views[0][name], views[1][name]) for name in views[0]]


def segment_attribution(measured: Any, simulated: Any) -> list[dict[str, Any]]:
    """Mean time per request-path segment group, measured vs simulated (seconds): the mean
    TTFT/E2EL errors are exactly the sums of these differences over their paths."""
    out = []
    for group, names in SEGMENT_GROUPS.items():
        row: dict[str, Any] = {"segment": group}
        for label, tables in (("measured", measured), ("simulated", simulated)):
            req = tables.requests[tables.requests["success"]]
            cols = [f"seg_{n}_s" for n in names if f"seg_{n}_s" in req.columns]
            row[label] = float(req[cols].sum(axis=1).mean()) if cols else 0.0
        out.append(row)
    return out


def diagnose(res: dict[str, Any]) -> list[str]:
    """Which stage's model misses, in words (each finding with its numbers)."""
    metrics, step, idle = res["metrics"], res["step_time"], res["after_idle"]
    notes = []
    misses = [f"{m} {s}" for m, (t50, t99) in TARGETS.items()
              for s, lim in (("p50", t50), ("p99", t99))
              if metrics[m].get(s) is not None and abs(metrics[m][s]) > lim]
    notes.append("All targets met (median within 5%, p99 within 10%)." if not misses else
                 "Outside the targets: " + ", ".join(misses) + ".")
    again = (res.get("repeatability") or {}).get("metrics")
    if again:
        floor = ", ".join(f"{m} p50 {_pct(again[m]['p50'])} / p99 {_pct(again[m]['p99'])}"
                          for m in TARGETS)
        notes.append(f"Noise floor (a second measured run of the same request stream vs the "
                     f"first): {floor}.")
    seg = sorted(res["segments"], key=lambda r: -abs(r["simulated"] - r["measured"]))
    if seg and seg[0]["measured"] > 0:
        parts = ", ".join(f"{r['segment']} {1e3 * (r['simulated'] - r['measured']):+.2f} ms"
                          for r in seg[:3])
        notes.append(f"Where the latency error sits (simulated − measured mean per request): "
                     f"{parts}.")
    drift = res["contention"].get("speed_drift")
    if drift is not None and abs(drift - 1) > 0.03:
        notes.append(f"Machine speed: the fixed probe steps took {drift - 1:+.0%} "
                     "time around this run compared with the profile (a shared host's speed "
                     "drifts; compare with the step-time model's error on the run's own "
                     "steps below before reading it as the cause).")
    fixed = res.get("speed_corrected")
    if fixed:
        left = ", ".join(f"{m} p50 {_pct(fixed['metrics'][m]['p50'])} / p99 "
                         f"{_pct(fixed['metrics'][m]['p99'])}" for m in TARGETS)
        notes.append(f"With the model scaled by that factor ({fixed['factor']:.3f}) the "
                     f"errors are: {left}.")
    bias = step.get("total_rel_err")
    if bias is not None and abs(bias) > 0.03:
        share = res["contention"].get("cpu_share")
        ratio = res["contention"].get("profile_cpu_ratio")
        why = ""
        if share is not None and ratio is not None:
            why = (f" The profile's samples had a median CPU/wall ratio of {ratio:.2f}, the "
                   f"measured loop {share:.2f} of a core")
            why += (": other processes took CPU during the run" if share < ratio - 0.03
                    else ".")
        notes.append(f"Step-time model: on this run's own {step['num_steps']} steps the fitted "
                     f"model's total step time is {bias:+.1%} off (per-step |err| median "
                     f"{step['median_abs_rel_err']:.1%}).{why}")
    notes += _wakeup_notes(idle)
    by = {r["stage"]: (r["measured"], r["simulated"]) for r in res["stages"]}
    m = by["schedule CPU per step"][0] + by["post-step CPU (update + outputs)"][0]
    s = by["schedule CPU per step"][1] + by["post-step CPU (update + outputs)"][1]
    period = by["loop period (schedule to schedule)"][0]
    if m > 0 and abs(s - m) > 0.02 * period:
        notes.append(f"Engine-loop CPU: schedule + post-step CPU is {m * 1e6:.0f} µs per step "
                     f"measured vs {s * 1e6:.0f} µs simulated ({(s - m) / period:+.1%} of the "
                     "loop period; fitted on the calibration runs).")
    m, s = by["mean scheduled requests per step"]
    if m > 0 and abs(s - m) / m > 0.05:
        notes.append(f"Batching: the simulated engine ran {s:.1f} requests per step on average, "
                     f"the measured {m:.1f} — step-time errors feed back into batch sizes and "
                     "queueing (stronger at high load).")
    return notes


def _rel_errors(cmp: dict[str, Any], run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    rows = {(r["metric"], r["stat"]): r for r in cmp["rows"] if r["run"] == run}
    return {m: {k: rows[(m, s)]["rel_diff"] for k, s in STATS} for m in METRICS}, rows


def write_validation(measured_dir: Path, simulated_dir: Path, fitted_path: Path, out_dir: Path,
                     *, plots: bool = True, extra: dict[str, Any] | None = None,
                     repeat_dir: Path | None = None,
                     corrected_dir: Path | None = None) -> dict[str, Any]:
    """compare/, validation.json, validation.md and the step scatter for one measured run;
    with ``repeat_dir`` (a second measured run of the same workload) also the run-to-run
    differences, the noise floor any simulator error should be read against; with
    ``corrected_dir`` (the simulation with the model scaled by the run's speed drift) the
    errors that remain once the machine's change of speed is taken out."""
    from experiments.validation.runs import read_step_shapes
    from reports.compare import compare_runs
    from reports.meta import write_json
    from reports.run_dir import load_run_dir
    from sim.cost.fitted import FittedCostModel

    model = FittedCostModel.load(fitted_path)
    cmp = compare_runs([measured_dir, simulated_dir], out_dir / "compare",
                       ["measured", "simulated"], plots=plots)
    metrics, rows = _rel_errors(cmp, "simulated")
    samples = read_step_shapes(measured_dir / "step_shapes.csv")
    m_meta, m_tables = load_run_dir(measured_dir)
    _, s_tables = load_run_dir(simulated_dir)
    result = {
        "metrics": metrics,
        "throughput": rows[("output_throughput", "value")]["rel_diff"],
        "throughputs": {k: rows[(k, "value")]["rel_diff"]
                        for k in ("request_throughput", "output_throughput",
                                  "total_token_throughput")},
        "step_time": step_time_errors(model, samples),
        "after_idle": after_idle_steps(m_tables.steps, samples, model),
        "values": {r["key"]: {"measured": rows_m["value"], "simulated": r["value"]}
                   for r, rows_m in _pairs(cmp["rows"])},
        "stages": [{"stage": n, "measured": m, "simulated": s}
                   for n, m, s in stage_table(m_tables, s_tables)],
        "segments": segment_attribution(m_tables, s_tables),
        "contention": {"cpu_share": (m_meta.get("stats") or {}).get("cpu_share"),
                       "profile_cpu_ratio": model.measured_on.get("cpu_ratio_median"),
                       "speed_drift": (m_meta.get("stats") or {}).get("speed_drift")},
        "fit": model.fit_report.get("holdout"),
        **(extra or {}),
    }
    if repeat_dir is not None:
        again = compare_runs([measured_dir, repeat_dir], out_dir / "compare_repeat",
                             ["measured", "repeat"], plots=False)
        repeat, repeat_rows = _rel_errors(again, "repeat")
        result["repeatability"] = {"metrics": repeat, "throughput":
                                   repeat_rows[("output_throughput", "value")]["rel_diff"]}
    if corrected_dir is not None:
        fixed = compare_runs([measured_dir, corrected_dir], out_dir / "compare_corrected",
                             ["measured", "corrected"], plots=False)
        corrected, corrected_rows = _rel_errors(fixed, "corrected")
        result["speed_corrected"] = {
            "factor": (m_meta.get("stats") or {}).get("speed_drift"), "metrics": corrected,
            "throughput": corrected_rows[("output_throughput", "value")]["rel_diff"]}
    result["diagnosis"] = diagnose(result)
    write_json(out_dir / "validation.json", result)
    png = plot_step_scatter(model, samples, out_dir / "step_time_scatter.png") if plots else None
    (out_dir / "validation.md").write_text(_markdown(result, png, measured_dir, simulated_dir))
    return result


def _pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    measured = {r["key"]: r for r in rows if r["run"] == "measured"}
    return [(r, measured[r["key"]]) for r in rows if r["run"] == "simulated"]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:+.1f}%"


def error_table(results: dict[str, dict[str, Any]], variant: str | None = None) -> list[str]:
    """Markdown rows: one line per (load, metric) with mean/p50/p90/p99 errors (and, where a
    repeat run exists, the measured run-to-run differences in parentheses). ``variant`` =
    ``speed_corrected``: the errors of the simulation scaled by the speed drift."""
    lines = ["| load | metric | mean | p50 | p90 | p99 |", "|---|---|---|---|---|---|"]
    for load, res in results.items():
        part = res if variant is None else res.get(variant)
        if not part:
            continue
        again = (res.get("repeatability") or {}).get("metrics") if variant is None else None
        for m in METRICS:
            e = part["metrics"][m]
            cells = [_pct(e[k]) + (f" ({_pct(again[m][k])})" if again else "") for k, _ in STATS]
            lines.append(f"| {load} | {m.upper()} | " + " | ".join(cells) + " |")
        lines.append(f"| {load} | throughput | {_pct(part['throughput'])} | | | |")
        if variant is None:
            lines.append(f"| {load} | step time (own shapes, median abs) | "
                         f"{_pct(res['step_time']['median_abs_rel_err'])} | | | |")
    return lines


def _markdown(res: dict[str, Any], png: Path | None, measured: Path, simulated: Path) -> str:
    lines = ["# Validation: simulated vs measured", "",
             f"Measured run: `{measured}`; simulated run: `{simulated}`; comparison: "
             "`compare/compare.md`. rel err = (simulated − measured) / measured; in "
             "parentheses, where measured twice, (run 2 − run 1) / run 1: the noise floor.", ""]
    lines += [*error_table({"this run": res}), ""]
    if res.get("speed_corrected"):
        lines += [f"With the cost model scaled by the run's speed drift "
                  f"({res['speed_corrected']['factor']:.3f}):", ""]
        lines += [*error_table({"this run": res}, "speed_corrected"), ""]
    lines += ["## Engine stages (medians per step)", "", "| stage | measured | simulated |",
              "|---|---|---|"]
    for s in res["stages"]:
        unit = 1.0 if "count" in s["stage"] or "requests" in s["stage"] else 1e3
        fmt = "{:.3f} ms" if unit == 1e3 else "{:.1f}"
        lines.append(f"| {s['stage']} | {fmt.format(s['measured'] * unit)} | "
                     f"{fmt.format(s['simulated'] * unit)} |")
    lines += ["", "## Request path (mean ms per request)", "",
              "| segment | measured | simulated | Δ |", "|---|---|---|---|"]
    for r in res["segments"]:
        delta = 1e3 * (r["simulated"] - r["measured"])
        lines.append(f"| {r['segment']} | {1e3 * r['measured']:.3f} | "
                     f"{1e3 * r['simulated']:.3f} | {delta:+.3f} |")
    idle = res["after_idle"]
    lines += ["", "## Step-time model on the run's own steps", "",
              "| steps | count | model total err | with wake-up cost | measured median |",
              "|---|---|---|---|---|"]
    for name in ("after_idle", "back_to_back"):
        g = idle[name]
        lines.append(f"| {name.replace('_', ' ')} | {g['num_steps']} | {_pct(g['total_rel_err'])}"
                     f" | {_pct(g.get('with_wakeup_total_rel_err'))}"
                     f" | {1e3 * g['measured_median_s']:.3f} ms |")
    lines += ["", "## Which stage misses, and why", ""] + [f"- {n}" for n in res["diagnosis"]]
    if png is not None:
        lines += ["", f"![per-step predicted vs measured]({png.name})"]
    return "\n".join(lines) + "\n"
