"""Write ``data/bursty_tenants.csv``: a bursty multi-tenant request stream for the policy examples.

Three tenants share one deployment for 120 s:

* ``chat`` — a steady Poisson stream of 3 req/s with the Azure 2023 *conversation* trace's
  lengths; SLO class ``interactive`` (the examples: TTFT 500 ms, TPOT 100 ms);
* ``agent`` — a steady 1.5 req/s with the Azure 2023 *code* trace's lengths (long prompts,
  short answers); SLO class ``interactive`` too;
* ``batch`` — bursts: every 30 s (from t = 10 s) 80 requests within 2 s, 3,000–6,000-token
  prompts and 200–500-token outputs; SLO class ``batch`` (TTFT 30 s, TPOT 200 ms).

The file is a request-stream CSV (``arrived_at, num_prefill_tokens, num_decode_tokens,
tenant, slo_class``) that ``twinserve`` reads as ``--dataset-path``; the SLO classes are
defined by the experiment files. Deterministic (seed 2024): rerunning rewrites the same bytes.

    python -m experiments.examples.make_bursty_trace
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from workload.traces import load_trace

OUT = Path(__file__).resolve().parent / "data" / "bursty_tenants.csv"
DURATION_S = 120.0
SEED = 2024


def _poisson(rng: np.random.Generator, rate: float) -> np.ndarray:
    gaps = rng.exponential(1.0 / rate, size=int(rate * DURATION_S * 2))
    times = np.cumsum(gaps)
    return times[times < DURATION_S]


def _lengths(rng: np.random.Generator, trace: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    rows = load_trace(trace)
    idx = rng.integers(0, len(rows.prompt_lens), n)
    return rows.prompt_lens[idx], rows.output_lens[idx]


def rows() -> list[tuple[float, int, int, str, str]]:
    rng = np.random.default_rng(SEED)
    out: list[tuple[float, int, int, str, str]] = []
    for tenant, rate, trace in (("chat", 3.0, "azure-conv"), ("agent", 1.5, "azure-code")):
        times = _poisson(rng, rate)
        prompts, outputs = _lengths(rng, trace, len(times))
        out += [(float(t), int(p), int(o), tenant, "interactive")
                for t, p, o in zip(times, prompts, outputs, strict=True)]
    for start in np.arange(10.0, DURATION_S, 30.0):
        times = start + np.sort(rng.uniform(0.0, 2.0, 80))
        prompts = rng.integers(3000, 6001, 80)
        outputs = rng.integers(200, 501, 80)
        out += [(float(t), int(p), int(o), "batch", "batch")
                for t, p, o in zip(times, prompts, outputs, strict=True)]
    out.sort(key=lambda r: r[0])
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens", "tenant",
                         "slo_class"])
        for t, p, o, tenant, cls in rows():
            writer.writerow([f"{t:.6f}", p, o, tenant, cls])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
