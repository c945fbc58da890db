"""Run metadata (``config.json``) and JSON that never chokes on numpy values.

``meta`` is a plain dict saved as ``config.json`` next to the tables. Its keys:

======================  ==========================================================================
``kind``                "simulated" or "real"
``config``              the run's full config dict (``SimConfig.to_dict()`` for simulated runs):
                        ``model``, ``seed``, ``frontend.num_api_servers``, ``workload.*`` …
``engine_config``       the resolved engine config (``max_num_batched_tokens``, KV blocks …)
``workload``            request_rate, burstiness, max_concurrency, source (override ``config``)
``stats``               run counters: ``api_server_busy_s``, ``output_processor_busy_s`` …
``seed``                the run's seed
``version``             twinserve's version
``git_commit``          the source tree's commit (None if unknown)
``compiled_modules``    how many modules ran compiled (``twinserve compile``; 0 = Python sources)
``label``               a name for comparisons (optional)
``date``                ``YYYYmmdd-HHMMSS`` when the run was reported (set on first write)
======================  ==========================================================================

``sim_result_meta`` builds it from a simulator result by duck typing, so ``reports`` need not
import ``sim``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np


def to_jsonable(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, dataclasses and paths as plain JSON types.

    Non-finite floats become the strings "inf"/"-inf" and NaN becomes None (strict JSON).
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: str | Path, value: Any) -> Path:
    path = Path(path)
    path.write_text(json.dumps(to_jsonable(value), indent=1, allow_nan=False) + "\n")
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def sim_result_meta(
    result: Any,
    *,
    version: str | None = None,
    git_commit: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """``meta`` for a ``sim.runtime.SimResult`` (read through its attributes only)."""
    config = result.config.to_dict()
    w = result.workload
    return {
        "kind": "simulated",
        "label": label,
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "version": version,
        "git_commit": git_commit,
        "seed": config.get("seed"),
        "config": config,
        "engine_config": to_jsonable(result.engine_config),
        "workload": {
            "num_prompts": len(w),
            "request_rate": w.request_rate,
            "burstiness": w.burstiness,
            "max_concurrency": w.max_concurrency,
            "source": w.source,
        },
        "stats": to_jsonable(result.stats),
        "reject_reasons_count": len(getattr(result, "reject_reasons", {}) or {}),
    }


def token_budget(meta: Mapping[str, Any]) -> int | None:
    """The run's ``max_num_batched_tokens`` if the metadata has it."""
    engine = meta.get("engine_config") or {}
    sched = engine.get("scheduler") or engine
    value = sched.get("max_num_batched_tokens") if isinstance(sched, Mapping) else None
    return int(value) if isinstance(value, (int, float)) else None
