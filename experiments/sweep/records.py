"""One simulated point → one flat result record (config columns + every summary metric).

``simulate_record`` is the pure function every sweep and capacity search is built on: the same
config dict and report options give the same record, except ``wall_time_s``. Records are flat
dicts of scalars (str, int, float, bool, None) so they load straight into a DataFrame and
round-trip through JSON:

* config columns: top-level fields by name (``gpu``, ``data_parallel_size``), section fields as
  ``section.field`` (``engine.max_num_seqs``, ``workload.request_rate``); lists as JSON text;
* vllm bench's summary keys (``request_throughput``, ``median_ttft_ms``, ``p99_tpot_ms`` …)
  with ``request_rate`` the offered rate (NaN for a trace replayed at its own times);
* ``slo_attainment_<slo>`` and ``slo_attainment_all``, ``engine_<stat>`` (prefix-cache hit
  rate, preemptions, KV usage …), ``diagnosis_verdict``;
* per request class when the workload has several priorities: ``prio<P>_<metric>``;
* per tenant and per SLO class when requests carry them: ``tenant_<name>_<figure>``,
  ``class_<name>_<figure>`` (``reports.classes``: requests, rejected, latency, attainment);
* ``policy_class`` (the scheduling policy's ``module:Class``) and ``bulk_fast_path`` (what the
  fast path did with it: ``on``, ``limited: …`` or ``off: …``, as in a run's metadata);
* ``num_gpus`` (= TP × DP), ``sim_num_steps``, ``sim_simulated_time_s``, ``wall_time_s``,
  ``version``, ``git_commit``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from engine.core.interfaces import CostModel

#: Summary keys not copied into records: vllm's header strings, nested sections (flattened
#: separately), duplicates of config columns, per-run dates.
_SKIPPED_SUMMARY_KEYS: frozenset[str] = frozenset({
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "burstiness", "max_concurrency", "rtfx", "goodput_slos_ms", "slo_attainment", "breakdown",
    "engine", "diagnosis", "kind", "config", "seed", "version", "git_commit", "report_options",
    "by_tenant", "by_slo_class",
})


def config_columns(config: Mapping[str, Any]) -> dict[str, Any]:
    """The full config dict as flat columns (see the module docstring)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            for name, v in value.items():
                out[f"{key}.{name}"] = _scalar(v)
        else:
            out[key] = _scalar(value)
    rate = out.get("workload.request_rate")
    if isinstance(rate, str):
        out["workload.request_rate"] = float(rate)  # "inf"
    return out


def _scalar(value: Any) -> Any:
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _number(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, str):
        return float(value)  # "inf"
    return float(value)


def summary_metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar metrics of a ``reports.metrics.summarize`` dict, flattened."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in _SKIPPED_SUMMARY_KEYS:
            continue
        out[key] = _number(value) if key == "request_rate" else _scalar(value)
    for name, value in (summary.get("slo_attainment") or {}).items():
        out[f"slo_attainment_{name}"] = value
    for name, value in (summary.get("engine") or {}).items():
        if isinstance(value, Mapping):
            for sub, v in value.items():
                out[f"engine_{name}_{sub}"] = _scalar(v)
        else:
            out[f"engine_{name}"] = _scalar(value)
    diagnosis = summary.get("diagnosis") or {}
    out["diagnosis_verdict"] = diagnosis.get("verdict")
    from reports.classes import flat_group_metrics  # (pandas: not at import time)

    out.update(flat_group_metrics(summary))
    return out


def class_metrics(
    tables: Any, priorities: np.ndarray, goodput: Mapping[str, float]
) -> dict[str, Any]:
    """Median/p99 TTFT and E2EL and SLO attainment per priority class (≥ 2 classes only)."""
    from reports.metrics import goodput_mask

    classes = np.unique(priorities)
    if len(classes) < 2:
        return {}
    req = tables.requests
    ok = req["success"].to_numpy(dtype=bool)
    ttft = req["ttft_s"].to_numpy(dtype=np.float64)
    e2el = req["e2el_s"].to_numpy(dtype=np.float64)
    tpot = np.nan_to_num(req["tpot_s"].to_numpy(dtype=np.float64), nan=0.0)
    out: dict[str, Any] = {}
    for p in classes.tolist():
        sel = ok & (priorities == p)
        pre = f"prio{p}_"
        out[pre + "num_requests"] = int((priorities == p).sum())
        out[pre + "completed"] = int(sel.sum())
        for name, values in (("ttft", ttft), ("e2el", e2el)):
            v = values[sel] * 1000
            out[f"{pre}median_{name}_ms"] = float(np.median(v)) if len(v) else math.nan
            out[f"{pre}p99_{name}_ms"] = float(np.percentile(v, 99)) if len(v) else math.nan
        if goodput and sel.any():
            good = goodput_mask(ttft[sel], tpot[sel], e2el[sel], goodput)
            out[pre + "slo_attainment_all"] = float(good.mean())
    return out


def simulate_record(
    config: Mapping[str, Any],
    report: Mapping[str, Any],
    *,
    cost_model: CostModel | None = None,
    run_dir: str | None = None,
) -> dict[str, Any]:
    """Simulate ``config`` (a full SimConfig dict) and return its flat record.

    ``report`` holds the summary options (``goodput`` {slo: ms}, ``percentiles``,
    ``percentile_metrics``). ``cost_model`` replaces the configured one (tests, planning with
    a synthetic model). ``run_dir``, when given, also receives a full run directory (tables,
    summary, report; no plots).
    """
    from experiments.run_meta import simulated_run_meta
    from reports.metrics import summarize
    from reports.tables import build_tables
    from sim.config import SimConfig
    from sim.runtime import SimRuntime

    t0 = time.perf_counter()
    cfg = SimConfig.from_dict(dict(config))
    result = SimRuntime(cfg, cost_model=cost_model).run()
    meta = simulated_run_meta(result)
    goodput = dict(report.get("goodput") or {})
    percentiles = [float(p) for p in report.get("percentiles") or [99.0]]
    metrics = [str(m) for m in report.get("percentile_metrics") or ["ttft", "tpot", "itl"]]
    if run_dir is not None:
        from reports.run_dir import write_run_dir

        summary = write_run_dir(run_dir, result.event_log, meta, goodput=goodput or None,
                                percentiles=percentiles, percentile_metrics=metrics, plots=False)
    tables = build_tables(result.event_log)
    if run_dir is None:
        summary = summarize(tables, meta, goodput=goodput or None, percentiles=percentiles,
                            percentile_metrics=metrics)
    record = config_columns(cfg.to_dict())
    record["num_gpus"] = cfg.tensor_parallel_size * cfg.data_parallel_size
    record.update(summary_metrics(summary))
    record.update(class_metrics(tables, result.workload.priorities, goodput))
    record["policy_class"] = result.scheduling_policy.get("class")
    record["bulk_fast_path"] = result.scheduling_policy.get("bulk_fast_path")
    record["sim_num_steps"] = result.stats.num_steps
    record["sim_simulated_time_s"] = result.stats.simulated_time_s
    record["version"] = meta.provenance.version
    record["git_commit"] = meta.provenance.git_commit
    record["wall_time_s"] = time.perf_counter() - t0
    return record


def effective_attainment(record: Mapping[str, Any]) -> float:
    """Fraction of *all* requests that completed and met every SLO (a rejected or failed
    request counts as a miss), from a record made with goodput SLOs."""
    att = record.get("slo_attainment_all")
    completed = record.get("completed") or 0
    failed = record.get("failed") or 0
    total = completed + failed
    if att is None or total == 0 or (isinstance(att, float) and math.isnan(att)):
        return 0.0
    return float(att) * completed / total
