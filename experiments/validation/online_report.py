"""The online validation's report: per load, per metric and per stage, with the noise floor.

For each load ``compare_load`` puts the client's measurement (vllm bench's definitions, from
the client's own records) beside the two simulated twins (``online_sim``): the *replayed* run's
error is the structure's, the *fitted* run's minus the replayed run's is the cost model's. Every
error stands beside the noise floor — the difference of a repeat of the identical stream to the
first measured run (the largest one when there are several repeats). Stages come from the run
directories: per-step medians (step time, the loop's CPU, the loop period, batch size) and the
mean time of each request-path segment (network and API-server queue, front-end CPU, IPC in and
the loop's pickup, scheduler waits, prefill, decode, output path).

``validation.json`` holds the numbers, ``validation.md`` the tables and a plain-words account of
which targets are met and, where not, which stage misses — the issue's targets: replayed within
2% of the measured p50 and 5% of p99, fitted within 5% and 10%, for TTFT, TPOT, ITL and E2EL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p90", "p99")
PERCENTILES = (50.0, 90.0, 99.0)
#: |relative error| targets at (p50, p99)
TARGETS = {"replayed": (0.02, 0.05), "fitted": (0.05, 0.10)}


def client_metrics(record: Any) -> dict[str, dict[str, float]]:
    """Mean and percentiles (seconds) of the client's measurement, as vllm bench defines them."""
    from experiments.loadgen.result import calculate_metrics

    m = calculate_metrics(record.outputs, record.end_s - record.start_s, {})
    lists = {"ttft": m.ttfts, "tpot": m.tpots, "itl": m.itls, "e2el": m.e2els}
    out: dict[str, dict[str, float]] = {}
    for key, values in lists.items():
        data = np.asarray(values or [0.0], dtype=np.float64)
        p = np.percentile(data, PERCENTILES)
        out[key] = {"mean": float(data.mean()), "p50": float(p[0]), "p90": float(p[1]),
                    "p99": float(p[2])}
    return out


def summary_metrics(summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The same statistics of a run directory's summary (ms keys → seconds)."""
    return {m: {s: float(summary[f"{s}_{m}_ms"]) / 1000 for s in STATS} for m in METRICS}


def _rel(value: float, base: float) -> float | None:
    if not base or math.isnan(base) or math.isnan(value):
        return None
    return (value - base) / base


def relative(a: Mapping[str, Mapping[str, float]],
             base: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    return {m: {s: _rel(a[m][s], base[m][s]) for s in STATS} for m in METRICS}


def noise_floor(records: Sequence[Any]) -> dict[str, dict[str, float | None]] | None:
    """(repeat − first) / first, the largest in magnitude over the repeats."""
    if len(records) < 2:
        return None
    first = client_metrics(records[0])
    diffs = [relative(client_metrics(r), first) for r in records[1:]]
    out: dict[str, dict[str, float | None]] = {}
    for m in METRICS:
        out[m] = {}
        for s in STATS:
            values: list[float] = [v for d in diffs if (v := d[m][s]) is not None]
            out[m][s] = max(values, key=lambda v: abs(v)) if values else None
    return out


#: request-path segments (``reports.breakdown``) as the report lists them, in path order
SEGMENTS: dict[str, tuple[str, ...]] = {
    # one segment: the simulator has no split of the API server's time before its handler
    "network in + API server (queue, validate, tokenize)": ("client_to_frontend",
                                                            "frontend_cpu"),
    "IPC in + engine-loop pickup": ("ipc_in",),
    "scheduler wait": ("wait_token_budget", "wait_max_num_seqs", "wait_kv_cache",
                       "wait_preemption", "wait_next_step"),
    "prefill steps": ("prefill",),
    "decode steps": ("decode",),
    "output path, first token": ("output_first",),
    "output path, last token": ("output_last",),
}


def segment_means(tables: Any) -> dict[str, float]:
    """Mean seconds per successful request in each of ``SEGMENTS``."""
    req = tables.requests[tables.requests["success"]]
    out = {}
    for name, parts in SEGMENTS.items():
        cols = [f"seg_{p}_s" for p in parts if f"seg_{p}_s" in req.columns]
        out[name] = float(req[cols].sum(axis=1).mean()) if cols and len(req) else 0.0
    return out


def stages(measured: Any, replayed: Any, fitted: Any) -> dict[str, list[dict[str, Any]]]:
    """Per-step medians and per-request segment means of the three runs (seconds)."""
    from experiments.validation.report import stage_table

    rows = []
    for (name, m, r), (_, _, f) in zip(stage_table(measured, replayed),
                                       stage_table(measured, fitted), strict=True):
        rows.append({"stage": name, "measured": m, "replayed": r, "fitted": f})
    means = [segment_means(t) for t in (measured, replayed, fitted)]
    segments = [{"segment": name, "measured": means[0][name], "replayed": means[1][name],
                 "fitted": means[2][name]} for name in SEGMENTS]
    return {"steps": rows, "segments": segments}


def compare_load(label: str, records: Sequence[Any], measured_dir: Path, replayed_dir: Path,
                 fitted_dir: Path, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of one load (see the module docstring)."""
    from reports.run_dir import load_run_dir

    measured = client_metrics(records[0])
    replayed = summary_metrics(json.loads((replayed_dir / "summary.json").read_text()))
    fitted = summary_metrics(json.loads((fitted_dir / "summary.json").read_text()))
    m_meta, m_tables = load_run_dir(measured_dir)
    r_meta, r_tables = load_run_dir(replayed_dir)
    _, f_tables = load_run_dir(fitted_dir)
    through = {}
    for name, d in (("measured", measured_dir), ("replayed", replayed_dir),
                    ("fitted", fitted_dir)):
        through[name] = json.loads((d / "summary.json").read_text())["output_throughput"]
    result: dict[str, Any] = {
        "label": label, **dict(extra),
        "measured_s": measured, "replayed_s": replayed, "fitted_s": fitted,
        "errors": {"replayed": relative(replayed, measured), "fitted": relative(fitted, measured)},
        "noise_floor": noise_floor(records),
        "throughput": {"measured": through["measured"],
                       "replayed": _rel(through["replayed"], through["measured"]),
                       "fitted": _rel(through["fitted"], through["measured"])},
        "stages": stages(m_tables, r_tables, f_tables),
        "replay_steps": {k.removeprefix("steps_"): v for k, v in r_meta.items()
                         if k.startswith("steps_")},
        "replay_fallback_scale": r_meta.get("fallback_scale"),
        "clock_alignment": m_meta.get("clock_alignment"),
    }
    result["findings"] = findings(result)
    return result


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:+.1f}%"


def target_misses(res: Mapping[str, Any], twin: str) -> list[str]:
    """``"ttft p99 (+7.2%)"``… of ``twin`` outside its targets."""
    t50, t99 = TARGETS[twin]
    misses = []
    for m in METRICS:
        for s, limit in (("p50", t50), ("p99", t99)):
            e = res["errors"][twin][m][s]
            if e is not None and abs(e) > limit:
                misses.append(f"{m.upper()} {s} ({_pct(e)})")
    return misses


#: the request-path segments each metric is made of (``SEGMENTS``' names)
PATH_OF: dict[str, tuple[str, ...]] = {
    "ttft": ("network in + API server (queue, validate, tokenize)",
             "IPC in + engine-loop pickup", "scheduler wait", "prefill steps",
             "output path, first token"),
    "tpot": ("decode steps", "output path, last token"),
    "itl": ("decode steps", "output path, last token"),
    "e2el": ("network in + API server (queue, validate, tokenize)",
             "IPC in + engine-loop pickup", "scheduler wait", "prefill steps", "decode steps",
             "output path, last token"),
}


def findings(res: Mapping[str, Any]) -> list[str]:
    """Which targets are met; where not, per missed metric the stage on its path that differs
    most (the structure's: replayed vs measured; the cost model's: fitted vs replayed), and
    the noise floor."""
    out = []
    seg = {r["segment"]: r for r in res["stages"]["segments"]}
    floor = res.get("noise_floor")
    for twin, what in (("replayed", "structure"), ("fitted", "cost model")):
        misses = target_misses(res, twin)
        t50, t99 = TARGETS[twin]
        if not misses:
            out.append(f"{twin}: every target met (p50 within {t50:.0%}, p99 within {t99:.0%}).")
            continue
        base = "measured" if twin == "replayed" else "replayed"
        where = []
        for m in METRICS:
            if not any(x.startswith(m.upper() + " ") for x in misses):
                continue
            path = [seg[name] for name in PATH_OF[m] if name in seg]
            worst = max(path, key=lambda r: abs(r[twin] - r[base]))
            where.append(f"{m.upper()}: '{worst['segment']}' "
                         f"{1e3 * (worst[twin] - worst[base]):+.3f} ms per request "
                         f"({base} {1e3 * worst[base]:.3f} ms)")
        out.append(f"{twin}: outside p50 {t50:.0%} / p99 {t99:.0%} for {', '.join(misses)}. "
                   f"The {what}'s largest difference on each missed metric's path — "
                   + "; ".join(where) + ".")
    own = res.get("step_model_on_run") or {}
    if own.get("total_rel_err") is not None:
        out.append(f"The fitted step model on this run's own {own['num_steps']} measured steps: "
                   f"{_pct(own['total_rel_err'])} in total (per step |err| median "
                   f"{100 * own['median_abs_rel_err']:.1f}%) — beyond the profile's held-out "
                   "error, the machine's change of speed between calibration and this run.")
    if floor is not None:
        parts = ", ".join(f"{m.upper()} p50 {_pct(floor[m]['p50'])} / p99 {_pct(floor[m]['p99'])}"
                          for m in METRICS)
        out.append(f"Noise floor (a repeat of the identical stream vs the first run): {parts}.")
    rs = res.get("replay_steps") or {}
    total = sum(int(v) for v in rs.values())
    if total:
        out.append(f"Replayed steps: {rs.get('replayed', 0)} of {total} simulated steps got the "
                   f"measured duration of their own batch shape; {rs.get('repeated', 0)} a "
                   f"repeated shape's mean, {rs.get('similar', 0)} the measured steps of their "
                   "kind (same requests, tokens, decodes and chunks; other contexts), "
                   f"{rs.get('fallback', 0)} the fitted model's, scaled by "
                   f"{res.get('replay_fallback_scale') or 1:.3f} to the run's own steps.")
    return out


def load_table(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Markdown: one row per (load, metric, stat): measured, replayed, fitted, noise floor."""
    lines = ["| load | metric | stat | measured (ms) | replayed | fitted | noise floor |",
             "|---|---|---|---|---|---|---|"]
    for label, res in results.items():
        floor = res.get("noise_floor")
        for m in METRICS:
            for s in ("p50", "p90", "p99"):
                measured = 1e3 * res["measured_s"][m][s]
                lines.append(
                    f"| {label} | {m.upper()} | {s} | {measured:.3f} | "
                    f"{_pct(res['errors']['replayed'][m][s])} | "
                    f"{_pct(res['errors']['fitted'][m][s])} | "
                    f"{_pct(floor[m][s]) if floor else '–'} |")
        t = res["throughput"]
        lines.append(f"| {label} | throughput | tok/s | {t['measured']:.1f} | "
                     f"{_pct(t['replayed'])} | {_pct(t['fitted'])} | |")
    return lines


def stage_lines(res: Mapping[str, Any]) -> list[str]:
    lines = ["| stage (median per step) | measured | replayed | fitted |", "|---|---|---|---|"]
    for r in res["stages"]["steps"]:
        count = "count" in r["stage"] or "requests" in r["stage"]
        cells = [f"{r[k]:.1f}" if count else f"{1e3 * r[k]:.3f} ms"
                 for k in ("measured", "replayed", "fitted")]
        lines.append(f"| {r['stage']} | " + " | ".join(cells) + " |")
    lines += ["", "| request-path segment (mean ms per request) | measured | replayed | fitted |",
              "|---|---|---|---|"]
    for r in res["stages"]["segments"]:
        lines.append(f"| {r['segment']} | {1e3 * r['measured']:.3f} | "
                     f"{1e3 * r['replayed']:.3f} | {1e3 * r['fitted']:.3f} |")
    return lines


def write_load_report(out_dir: Path, res: Mapping[str, Any]) -> None:
    from reports.meta import write_json

    write_json(out_dir / "validation.json", res)
    lines = [f"# Validation at {res['label']}: served vs simulated", "",
             f"Request rate {res.get('request_rate', float('nan')):.2f} req/s"
             f" ({res.get('load_fraction') or 'given'} of the measured capacity "
             f"{res.get('capacity_rps', float('nan')):.1f} req/s). Measured at the client "
             "(`measured/`), simulated twice with the identical stream: with the measured steps "
             "replayed (`replayed/`: the structure's error) and with the fitted cost model "
             "(`simulated/`). Errors are (simulated − measured) / measured; the noise floor is "
             "a repeat of the identical stream vs the first run.", ""]
    lines += [*load_table({res["label"]: res}), "", "## Stages", "", *stage_lines(res), "",
              "## Which stage misses, and why", ""]
    lines += [f"- {f}" for f in res["findings"]]
    (out_dir / "validation.md").write_text("\n".join(lines) + "\n")


def write_summary(out: Path, results: Mapping[str, Mapping[str, Any]],
                  header: Mapping[str, Any]) -> list[str]:
    """``validation.md`` and ``validation_summary.json`` at the top; the table's lines."""
    from reports.meta import write_json

    write_json(out / "validation_summary.json", {**dict(header), "loads": results})
    table = load_table(results)
    lines = ["# Validation of the simulator against the served engine", "",
             f"Model {header.get('model')} on {header.get('device')}; capacity "
             f"{header.get('capacity_rps', float('nan')):.1f} req/s (measured); CPUs: "
             f"{header.get('layout')}. Errors are (simulated − measured) / measured; "
             "**replayed**: the simulator replaying the measured steps (the structure's "
             "error), **fitted**: the fitted cost model (structure + cost model); the noise "
             "floor is a repeat of the identical stream.", "", *table, "",
             "Targets: replayed within 2% at p50 and 5% at p99, fitted within 5% and 10%.", ""]
    for label, res in results.items():
        lines += [f"## {label}", "", *[f"- {f}" for f in res["findings"]], ""]
    (out / "validation.md").write_text("\n".join(lines) + "\n")
    return table
