"""What the tools that read ``vllm bench serve`` result files take from them.

``read_result`` loads a result file as vLLM's readers do (``json.load`` of the file; ``vllm
bench sweep`` puts each run's dict into one ``pandas.DataFrame.from_records`` row) and checks
the contract they rely on — vllm 0.33.0's keys and units:

* the setup and scalar keys of ``VLLM_KEYS`` (``request_rate`` a number or "inf",
  ``max_concurrency`` an int or null, ``request_goodput`` null without SLOs);
* ``latencies`` and ``queue_times`` (seconds, one per request) even without details; with
  ``--save-detailed`` also ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``start_times``,
  ``generated_texts``, ``errors``;
* ``mean_/median_/std_/p{P}_{metric}_ms`` numbers in milliseconds for each reported metric: the
  sweep tools read ``median_ttft_ms``, ``p99_e2el_ms`` …, ``vllm bench sweep serve_workload``
  estimates concurrency as ``request_throughput * mean_e2el_ms / 1000``, the Pareto plot reads
  ``output_throughput`` and ``max_concurrency`` or ``max_concurrent_requests``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

VLLM_KEYS = (
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "latencies", "queue_times",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
)
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts",
               "errors")
STAT_PREFIXES = ("mean", "median", "std")


def read_result(path: Path) -> dict[str, Any]:
    """The result as vLLM's readers load it, after checking their contract."""
    with path.open("rb") as f:
        result: dict[str, Any] = json.load(f)
    check_result(result)
    frame = pd.DataFrame.from_records([result])  # vllm bench sweep's summary row
    assert float(frame["request_throughput"].iloc[0]) == result["request_throughput"]
    return result


def check_result(r: dict[str, Any]) -> None:
    missing = [k for k in VLLM_KEYS if k not in r]
    assert not missing, f"missing vllm keys: {missing}"
    assert r["endpoint_type"] == r["backend"]
    assert r["request_rate"] == "inf" or isinstance(r["request_rate"], (int, float))
    assert r["max_concurrency"] is None or isinstance(r["max_concurrency"], int)
    for key in ("duration", "request_throughput", "output_throughput", "total_token_throughput",
                "max_output_tokens_per_s", "rtfx"):
        assert isinstance(r[key], float), key
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens",
                "num_prompts", "max_concurrent_requests"):
        assert isinstance(r[key], int), key
    n = r["completed"] + r["failed"]
    assert len(r["latencies"]) == len(r["queue_times"]) == n
    assert r["request_throughput"] == r["completed"] / r["duration"]
    if any(k in r for k in DETAIL_KEYS):
        assert all(len(r[k]) == n for k in DETAIL_KEYS)
        assert sum(r["output_lens"]) == r["total_output_tokens"]
    ok = [lat for lat, err in zip(r["latencies"], r.get("errors") or [""] * n, strict=True)
          if not err and lat > 0]
    if "mean_e2el_ms" in r and ok:  # milliseconds of the per-request seconds
        assert math.isclose(r["mean_e2el_ms"], float(np.mean(ok)) * 1000, rel_tol=1e-9)
        concurrency = r["request_throughput"] * r["mean_e2el_ms"] / 1000  # sweep's estimate
        assert concurrency > 0
    for key, value in r.items():
        if key.endswith("_ms"):
            assert isinstance(value, float) and value >= 0, key
