"""End-to-end validation of the default cost model against published vLLM measurements.

    python -m bench.cost_validation [--cost-model vllm] [--compare roofline] [--rows CSV]
                                    [--steps CSV] [--limit N] [--out CSV]

Every row of ``bench/data/validation_set.csv`` (published end-to-end results with their
sources and vLLM versions; bench/data/VALIDATION.md) whose deployment and workload the
simulator can reproduce is simulated with the default configuration (vLLM 0.33 defaults,
``--cost-model auto``) and compared with the published value; the table printed last gives
the median and 90th-percentile |error| per source and metric. Rows that need a workload or a
GPU the simulator does not have are listed separately, never guessed. Nothing here feeds back
into a default: the set is for validation only.

Workloads, fixed before looking at any error:

* ``aic_silicon`` — closed loop at the row's concurrency ``c`` with fixed input/output lengths,
  mean TTFT and mean per-request TPOT ((e2e − TTFT) / (osl − 1)), KV cache in the model dtype
  (``auto``: the source does not state it), vLLM's defaults (prefix caching on). The source
  does not state its benchmark; the public evidence (aiconfigurator's generated benchmark
  script, ``bench_run.sh.j2``, runs ``aiperf profile --concurrency c --num-requests 20c
  --warmup-request-count 2c`` with synthetic prompts; aiperf's defaults) gives the default
  ``--procedure aiperf``, fixed from that evidence before its errors were seen: ``2·c``
  warm-up requests started at once and drained, then ``20·c`` measured requests started at
  once from the idle server; every prompt drawn at random (with replacement, seeded) from a
  pool of ``AIPERF_PROMPT_POOL`` = 100 distinct prompts, as aiperf's synthetic dataset does,
  so repeated prompts can hit the prefix cache. Two earlier procedures stay for comparison:
  ``staggered`` (``6·c`` unique prompts, the first ``c`` spread over one request's latency,
  the first ``2·c`` left out of the means; chosen last round *after* a burst start's errors
  were seen) and ``burst`` (``6·c`` unique prompts, the first ``c`` at once, all averaged, as
  ``vllm bench serve --max-concurrency c``);
* ``vllm_ci_*`` latency — ``vllm bench latency``: 8 prompts of 32 tokens at once, 128 output
  tokens each, the time until the last one is delivered; the offline ``LLM`` class's budgets
  (16384 batched tokens on H100/H200, 8192 on A100) and no prefix caching (the benchmark turns
  it off: ``vllm/benchmarks/latency.py``);
* ``splitwise_perf_model`` — the source's static batches: ``B`` requests of ``P`` prompt
  tokens sent together, ``T`` output tokens each, no prefix caching (the source reused no KV
  cache), the offline ``LLM`` class's budgets as for the latency rows; mean TTFT and mean
  per-request TPOT over the batch. Not reproduced: a batch's TTFT (``prompt_time`` with
  ``B > 1``: the source does not say whose first token it times), and requests longer than
  Llama-2-70B's 4,096-token context (vLLM refuses them; the source does not say how its
  engine ran them).

Scheduling: every row runs with the scheduling its vLLM did by default (``--scheduling
published``). vLLM made async scheduling the default in 0.14.0 (release notes: "Async
scheduling is now enabled by default", PR #27614); earlier releases and the V0 engine schedule
synchronously, so the host work of every step (scheduling, input preparation, launches, output
update) adds to it. A row's ``vllm_version`` decides: a release below 0.14.0, or a measurement
dated before 2025-12-30 (vLLM main turned the default on in late December 2025), runs
synchronously; a row with neither version nor date runs vLLM 0.33's default (async).
``--scheduling async`` runs every row asynchronously, as vLLM 0.33 would.

``--steps CSV`` compares measured per-step times (columns ``model, gpu, tp, quantization,
kv_cache_dtype, step, measured_ms, source``; ``step`` in ``--explain-step`` syntax) with the
cost model's step time — for sets of measured engine steps kept outside this repository.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "validation_set.csv"

#: Published model names -> (catalog model, --quantization, max_model_len or None).
MODELS: dict[str, tuple[str, str | None, int | None]] = {
    "meta-llama/Llama-3.1-8B": ("llama-3.1-8b", None, None),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama-3.1-8b", None, None),
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("llama-3.1-8b", "fp8", None),
    "meta-llama/Llama-3.1-70B": ("llama-3.1-70b", None, None),
    "meta-llama/Meta-Llama-3-70B": ("llama-3.1-70b", None, 8192),  # Llama-3 70B: same shapes
    "meta-llama/Llama-2-70b-hf": ("meta-llama/Llama-2-70b-hf", None, None),
}
#: The Splitwise authors' static batches (bench/data/VALIDATION.md).
SPLITWISE = "splitwise_perf_model"
#: First vLLM release that schedules asynchronously by default (v0.14.0 release notes,
#: https://github.com/vllm-project/vllm/releases/tag/v0.14.0, PR #27614).
ASYNC_DEFAULT_RELEASE = (0, 14)
#: Measurements dated before this day ran a vLLM that scheduled synchronously by default: main
#: turned async scheduling on in late December 2025 ("Upstream vllm just enabled asynchronous
#: scheduling", vllm-project/vllm-ascend#5524, 2025-12-30, on 0.14.0rc1.dev173).
ASYNC_DEFAULT_DATE = "2025-12-30"
#: Rows whose workload the simulator cannot reproduce from what the source publishes.
NEEDS_WORKLOAD = {
    "request_throughput": "ShareGPT sample of the CI run (prompts and output lengths)",
    "token_throughput": "MLPerf llama3.1-8b (CNN/DailyMail) request lengths and arrivals",
}


@dataclass(frozen=True)
class Row:
    row_id: int
    source: str
    gpu: str
    tp: int
    model: str
    weight_dtype: str
    metric: str
    statistic: str
    value: float
    unit: str
    isl: int | None
    osl: int | None
    concurrency: int | None
    workload: str
    vllm_version: str

    @staticmethod
    def parse(r: dict[str, str]) -> Row:
        def opt_int(text: str) -> int | None:
            return int(float(text)) if text else None

        return Row(int(r["row_id"]), r["source_id"], r["gpu"], int(r["tp"]), r["model"],
                   r["weight_dtype"], r["metric"], r["statistic"], float(r["value"]), r["unit"],
                   opt_int(r["isl"]), opt_int(r["osl"]), opt_int(r["concurrency"]),
                   r["workload"], r["vllm_version"])


@dataclass(frozen=True)
class Outcome:
    row: Row
    predicted: float | None  # None: not simulated
    reason: str = ""  # why not

    @property
    def error(self) -> float:
        assert self.predicted is not None
        return self.predicted / self.row.value - 1.0


def read_rows(path: Path = DATA) -> list[Row]:
    with path.open(newline="") as f:
        return [Row.parse(r) for r in csv.DictReader(f)]


def why_not(row: Row) -> str:
    """Why a row cannot be simulated ("" if it can)."""
    from sim.hardware import GPUS

    if row.gpu not in GPUS:
        return f"GPU {row.gpu} not in the catalog"
    base = row.model.split(" (")[0]
    if base not in MODELS:
        return f"model {row.model} not mapped"
    if row.metric in NEEDS_WORKLOAD:
        return "needs " + NEEDS_WORKLOAD[row.metric]
    if row.source.startswith("inferencebench"):
        return "needs the llm.inference.chatbot-short request lengths (not published)"
    if row.metric not in ("ttft", "tpot", "batch_latency", "decode_rate_per_user"):
        return f"metric {row.metric} not reproduced"
    if row.source == "aic_silicon" and not (row.isl and row.osl and row.concurrency):
        return "lengths or concurrency missing"
    if row.source == SPLITWISE and row.metric == "ttft" and (row.concurrency or 1) > 1:
        return "TTFT of a batch: the source does not say whose first token it times"
    context = _context_tokens(base)
    if (row.isl or 0) + (row.osl or 0) > context:
        return (f"longer than {base}'s {context}-token context (vLLM refuses it; how the "
                "source ran it is not stated)")
    return ""


def _context_tokens(published_model: str) -> int:
    """The longest request a row's deployment takes: its ``max_model_len`` as ``MODELS``
    sets it, else the catalog model's context."""
    from sim.model_catalog import get_model

    catalog_name, _, max_len = MODELS[published_model]
    return max_len or get_model(catalog_name).max_model_len


def published_async(vllm_version: str) -> bool:
    """Whether the vLLM a row names (a release, or a measurement date) scheduled
    asynchronously by default; True (vLLM 0.33's default) when it names neither."""
    release = re.match(r"(\d+)\.(\d+)", vllm_version)
    if release:
        return (int(release[1]), int(release[2])) >= ASYNC_DEFAULT_RELEASE
    day = re.search(r"\d{4}-\d{2}-\d{2}", vllm_version)
    if day:
        return day[0] >= ASYNC_DEFAULT_DATE
    return True


def sim_config(row: Row, cost_model: str, scheduling: str = "published") -> Any:
    """The SimConfig of a row's deployment and workload (module docstring); ``scheduling``
    is "published" (the row's vLLM default) or "async" (vLLM 0.33's)."""
    from sim.config import EngineKnobs, SimConfig
    from workload.config import WorkloadConfig

    async_scheduling = scheduling == "async" or published_async(row.vllm_version)

    model, quant, max_len = MODELS[row.model.split(" (")[0]]
    if row.weight_dtype == "fp8":
        quant = "fp8"
    dtype = "float16" if row.weight_dtype == "fp16" else "auto"
    common: dict[str, Any] = dict(model=model, gpu=row.gpu, tensor_parallel_size=row.tp,
                                  cost_model=cost_model, quantization=quant, dtype=dtype,
                                  max_model_len=max_len)
    if row.metric == "batch_latency" or row.source == SPLITWISE:
        tokens, seqs = (8192, 256) if row.gpu.startswith("a100") else (16384, 1024)
        isl, osl = row.isl or 32, row.osl or 128
        return SimConfig(
            **common, engine=EngineKnobs(max_num_batched_tokens=tokens, max_num_seqs=seqs,
                                         enable_prefix_caching=False,
                                         async_scheduling=async_scheduling),
            workload=WorkloadConfig(dataset_name="random", num_prompts=row.concurrency or 8,
                                    request_rate=math.inf, random_input_len=isl,
                                    random_output_len=osl, seed=0))
    conc = row.concurrency or 1
    return SimConfig(**common, engine=EngineKnobs(async_scheduling=async_scheduling),
                     workload=WorkloadConfig(
                         dataset_name="random", num_prompts=6 * conc, request_rate=math.inf,
                         max_concurrency=conc, random_input_len=row.isl or 1024,
                         random_output_len=row.osl or 128, seed=0))


def metrics_of(result: Any, skip: int = 0) -> dict[str, float]:
    """Mean TTFT, TPOT and end-to-end latency (ms) of the requests after the first ``skip``,
    batch latency (ms: first arrival to last delivery) and single-user decode rate (tok/s)."""
    from reports.tables import build_tables

    req = build_tables(result.event_log).requests.sort_values("req_index")
    ok = req["success"].to_numpy(dtype=bool).copy()
    ok[:skip] = False
    ttft = req["ttft_s"].to_numpy(dtype=float)[ok]
    e2el = req["e2el_s"].to_numpy(dtype=float)[ok]
    tpot = req["tpot_s"].to_numpy(dtype=float)[ok]
    tpot = tpot[~(tpot != tpot)]
    start = float(req["arrival_s"].to_numpy(dtype=float).min())
    end = float(req["last_token_delivered_s"].to_numpy(dtype=float)[ok].max())
    mean_tpot = float(tpot.mean()) if len(tpot) else math.nan
    return {
        "ttft": float(ttft.mean()) * 1e3,
        "tpot": mean_tpot * 1e3,
        "e2el": float(e2el.mean()) * 1e3,
        "batch_latency": (end - start) * 1e3,
        "decode_rate_per_user": 1.0 / mean_tpot,
    }


#: aiperf's synthetic dataset size (``--num-dataset-entries`` default): prompts reused at random.
AIPERF_PROMPT_POOL = 100
#: aiconfigurator's benchmark script: ``--num-requests 20c``, ``--warmup-request-count 2c``.
AIPERF_MEASURED_PER_SLOT = 20
AIPERF_WARMUP_PER_SLOT = 2
#: The seed the script passes (``--random-seed 100``), for the prompt draws.
AIPERF_SEED = 100
PROCEDURES = ("aiperf", "staggered", "burst")


def run_rows(rows: Iterable[Row], cost_model: str, procedure: str = "aiperf",
             scheduling: str = "published") -> list[Outcome]:
    from sim.runtime import run_simulation

    cache: dict[Any, dict[str, float]] = {}
    out = []
    for row in rows:
        reason = why_not(row)
        if reason:
            out.append(Outcome(row, None, reason))
            continue
        cfg = sim_config(row, cost_model, scheduling)
        key = repr(cfg.to_dict())
        if key not in cache:
            if row.source == "aic_silicon" and procedure == "aiperf":
                cache[key] = aiperf_metrics(cfg)
            elif row.source == "aic_silicon" and procedure == "staggered":
                cache[key] = steady_state_metrics(cfg)
            else:
                cache[key] = metrics_of(run_simulation(cfg))
        out.append(Outcome(row, cache[key][row.metric]))
    return out


def steady_state_metrics(cfg: Any) -> dict[str, float]:
    """Closed-loop metrics after a staggered start and a warm-up (module docstring)."""
    import dataclasses

    import numpy as np

    from sim.runtime import SimRuntime
    from workload.build import build_workload

    conc = cfg.workload.max_concurrency
    work = build_workload(cfg.workload)
    burst = metrics_of(SimRuntime(cfg, workload=work).run())
    latency_s = burst["e2el"] / 1e3
    send = np.zeros(len(work))
    send[:conc] = np.arange(conc) * (latency_s / conc)
    staggered = dataclasses.replace(work, send_time_s=send)
    return metrics_of(SimRuntime(cfg, workload=staggered).run(), skip=2 * conc)


def aiperf_metrics(cfg: Any) -> dict[str, float]:
    """Closed-loop metrics as aiperf measures them (module docstring): a warm-up of ``2·c``
    requests started at once and drained, then ``20·c`` started at once from the idle server
    and averaged; prompts drawn from a pool of ``AIPERF_PROMPT_POOL``, whole prompts shared."""
    import dataclasses

    import numpy as np

    from sim.runtime import SimRuntime
    from workload.build import build_workload

    conc = cfg.workload.max_concurrency
    num_warmup = AIPERF_WARMUP_PER_SLOT * conc
    total = num_warmup + AIPERF_MEASURED_PER_SLOT * conc
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, num_prompts=total))
    work = build_workload(cfg.workload)
    draws = np.random.default_rng(AIPERF_SEED).integers(0, AIPERF_PROMPT_POOL, size=total)
    pooled = dataclasses.replace(work, shared_prefix_ids=draws.astype(np.int64),
                                 shared_prefix_lens=work.prompt_lens.copy())
    # the warm-up alone, to know when it has drained; the measured requests start after it
    per_request = {f.name: getattr(pooled, f.name) for f in dataclasses.fields(pooled)}
    warm = dataclasses.replace(pooled, **{name: column[:num_warmup] for name, column
                                          in per_request.items()
                                          if isinstance(column, np.ndarray)})
    drained_s = float(metrics_of(SimRuntime(cfg, workload=warm).run())["batch_latency"]) / 1e3
    send = np.zeros(total)
    send[num_warmup:] = drained_s + 1.0  # one idle second, then the burst
    run = SimRuntime(cfg, workload=dataclasses.replace(pooled, send_time_s=send)).run()
    return metrics_of(run, skip=num_warmup)


# -- per-step rows -------------------------------------------------------------------------------
def run_steps(path: Path, cost_model: str) -> list[tuple[dict[str, str], float]]:
    """(row, predicted ms) of every measured step in ``path``."""
    from sim.config import SimConfig
    from sim.cost.explain import parse_step
    from sim.runtime import make_cost_model

    out = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            cfg = SimConfig(model=r["model"], gpu=r["gpu"], tensor_parallel_size=int(r["tp"]),
                            cost_model=cost_model, quantization=r.get("quantization") or None,
                            kv_cache_dtype=r.get("kv_cache_dtype") or "auto")
            shape = parse_step(r["step"])
            out.append((r, make_cost_model(cfg).step_time(shape).total_s * 1e3))
    return out


# -- tables --------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%" if x == x else "—"


def summary(outcomes: list[Outcome]) -> list[tuple[str, str, int, float, float, float]]:
    """(source, metric, rows, median |err|, p90 |err|, median signed err)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for o in outcomes:
        if o.predicted is not None and o.predicted == o.predicted:
            groups.setdefault((o.row.source, o.row.metric), []).append(o.error)
    out = []
    for (src, metric), errs in sorted(groups.items()):
        abs_errs = sorted(abs(e) for e in errs)
        out.append((src, metric, len(errs), statistics.median(abs_errs),
                    _quantile(abs_errs, 0.9), statistics.median(errs)))
    return out


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) of sorted values."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def print_tables(results: dict[str, list[Outcome]], steps: dict[str, list[tuple[dict[str, str],
                 float]]], scheduling: str = "published") -> None:
    names = list(results)
    first = results[names[0]]
    print("## Rows not simulated\n")
    reasons: dict[str, list[int]] = {}
    for o in first:
        if o.predicted is None:
            reasons.setdefault(f"{o.row.source}: {o.reason}", []).append(o.row.row_id)
    for reason, ids in sorted(reasons.items()):
        print(f"- {reason} ({len(ids)} rows)")
    print(f"\n## Scheduling of the simulated rows (--scheduling {scheduling})\n")
    modes: dict[tuple[str, str], int] = {}
    for o in first:
        if o.predicted is not None:
            sync = scheduling == "published" and not published_async(o.row.vllm_version)
            key = (o.row.source, "sync" if sync else "async")
            modes[key] = modes.get(key, 0) + 1
    for (source, mode), n in sorted(modes.items()):
        print(f"- {source}: {mode} ({n} rows)")
    print("\n## Per row (first 40 simulated)\n")
    print("| row | source | deployment | workload | metric | published | "
          + " | ".join(names) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(names))
    shown = 0
    for i, o in enumerate(first):
        if o.predicted is None or shown >= 40:
            continue
        shown += 1
        r = o.row
        dep = f"{r.model.split('/')[-1]} {r.weight_dtype} {r.gpu} TP{r.tp}"
        work = f"{r.isl}/{r.osl} c={r.concurrency}"
        cells = []
        for name in names:
            p = results[name][i]
            cells.append(f"{p.predicted:.4g} ({_pct(p.error)})" if p.predicted is not None
                         else "—")
        print(f"| {r.row_id} | {r.source} | {dep} | {work} | {r.metric} | {r.value:g} {r.unit}"
              f" | " + " | ".join(cells) + " |")
    if steps:
        print("\n## Measured steps\n")
        print("| source | model | GPU | TP | step | measured ms | " + " | ".join(steps) + " |")
        print("|---|---|---|---|---|---|" + "---|" * len(steps))
        first_steps = steps[next(iter(steps))]
        for j, (r, _) in enumerate(first_steps):
            meas = float(r["measured_ms"])
            cells = [f"{steps[n][j][1]:.3f} ({_pct(steps[n][j][1] / meas - 1)})" for n in steps]
            print(f"| {r.get('source', '')} | {r['model']} | {r['gpu']} | {r['tp']} | "
                  f"{r['step']} | {meas:g} | " + " | ".join(cells) + " |")
        for name, got in steps.items():
            errs = sorted(abs(p / float(r["measured_ms"]) - 1) for r, p in got)
            print(f"\n{name}: {len(errs)} steps, median |error| "
                  f"{statistics.median(errs) * 100:.1f}%, p90 {_quantile(errs, 0.9) * 100:.1f}%")
    print("\n## Error table (|predicted / published − 1|)\n")
    print("| source | metric | rows | " + " | ".join(
        f"{n} median | {n} p90 | {n} median signed" for n in names) + " |")
    print("|---|---|---|" + "---|---|---|" * len(names))
    per_model = {n: {(s, m): (k, a, b, c) for s, m, k, a, b, c in summary(results[n])}
                 for n in names}
    for key in sorted(per_model[names[0]]):
        k = per_model[names[0]][key][0]
        cells = []
        for n in names:
            _, a, b, c = per_model[n].get(key, (0, math.nan, math.nan, math.nan))
            cells.append(f"{a * 100:.1f}% | {b * 100:.1f}% | {_pct(c)}")
        print(f"| {key[0]} | {key[1]} | {k} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cost-model", default="auto", help="the model validated (default: auto)")
    ap.add_argument("--compare", nargs="*", default=["roofline"],
                    help="other cost models to show beside it (default: roofline)")
    ap.add_argument("--rows", type=Path, default=DATA, help="validation set CSV")
    ap.add_argument("--steps", type=Path, help="measured per-step times CSV (module docstring)")
    ap.add_argument("--limit", type=int, help="simulate only the first N rows (smoke runs)")
    ap.add_argument("--procedure", choices=PROCEDURES, default="aiperf",
                    help="how closed-loop rows are measured (module docstring; default aiperf)")
    ap.add_argument("--scheduling", choices=["published", "async"], default="published",
                    help="sync or async scheduling as each row's vLLM defaulted to, or async "
                         "for every row (module docstring; default published)")
    ap.add_argument("--out", type=Path, help="write every row's prediction to this CSV")
    args = ap.parse_args(argv)
    rows = read_rows(args.rows)[: args.limit]
    t0 = time.perf_counter()
    results: dict[str, list[Outcome]] = {}
    steps: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name in [args.cost_model, *args.compare]:
        results[name] = run_rows(rows, name, args.procedure, args.scheduling)
        if args.steps is not None:
            steps[name] = run_steps(args.steps, name)
    if args.out is not None:
        with args.out.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["row_id", "source", "metric", "published", *results])
            for i, o in enumerate(results[args.cost_model]):
                w.writerow([o.row.row_id, o.row.source, o.row.metric, o.row.value,
                            *(results[n][i].predicted for n in results)])
    print_tables(results, steps, args.scheduling)
    print(f"\n({len(rows)} rows, {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
