"""config.json of a run: what was run, on what, with which seed and code, and how it went.

One builder per world, so the CLI commands, the sweeps and the validation write the same
metadata for the same kind of run: ``simulated_run_meta`` for a ``sim.runtime.SimResult``,
``measured_run_meta`` for a run of the real engine (``engine.serve.real_run``). The keys are
``reports.meta``'s (that module documents them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.provenance import provenance


def engine_config_dict(engine_config: Any) -> dict[str, dict[str, Any]]:
    """An ``EngineConfig`` as config.json keeps it: {"scheduler": {...}, "cache": {...}}."""
    sched, cache = engine_config.scheduler, engine_config.cache
    return {
        "scheduler": {k: getattr(sched, k) for k in sched.__dataclass_fields__},
        "cache": {k: getattr(cache, k) for k in cache.__dataclass_fields__},
    }


def simulated_run_meta(result: Any) -> dict[str, Any]:
    """config.json content of a simulated run: everything needed to rerun it."""
    stats = result.stats
    engine = result.engine_config
    return {
        "kind": "simulated",
        "config": result.config.to_dict(),
        "engine_config": engine_config_dict(engine),
        "model_id": result.config.model,
        "gpu": result.config.gpu,
        "tensor_parallel_size": result.config.tensor_parallel_size,
        "num_api_servers": result.config.frontend.num_api_servers,
        "seed": result.config.seed,
        "workload": {
            "source": result.workload.source,
            "num_prompts": len(result.workload),
            "request_rate": result.workload.request_rate,
            "burstiness": result.workload.burstiness,
            "max_concurrency": result.workload.max_concurrency,
        },
        "stats": {k: float(getattr(stats, k)) for k in stats.__dataclass_fields__},
        "reject_reasons": result.reject_reasons,
        **provenance(),
    }


def measured_run_meta(
    engine: Any, workload: Any, result: Any, wall_s: float
) -> dict[str, Any]:
    """config.json content of a measured run."""
    return {
        "kind": "real",
        "config": {  # the engine knobs as a simulated run's config keeps them: "engine"
            "engine_args": {k: getattr(engine.args, k)
                            for k in engine.args.__dataclass_fields__ if k != "engine"},
            "engine": dataclasses.asdict(engine.args.engine),
        },
        "engine_config": engine_config_dict(engine.engine_config),
        "model_id": str(engine.args.model),
        "device": str(engine.executor.device),
        "attention_backend": engine.executor.attention_backend,
        "num_api_servers": 1,
        "seed": int(workload.extra.get("seed", 0)),
        "workload": {
            "source": workload.source,
            "num_prompts": len(workload),
            "request_rate": workload.request_rate,
            "burstiness": workload.burstiness,
            "max_concurrency": workload.max_concurrency,
        },
        "stats": {
            "num_requests": len(workload),
            "num_rejected": result.num_rejected,
            "num_steps": result.event_log.num_steps,
            "wall_time_s": wall_s,
            "simulated_time_s": result.wall_time_s,
            "api_server_busy_s": 0.0,
            "output_processor_busy_s": 0.0,
        },
        "reject_reasons": result.reject_reasons,
        **provenance(),
    }
