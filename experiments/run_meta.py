"""The metadata of a run (``reports.meta.RunMeta``, ``config.json``): one builder per world.

``simulated_run_meta`` describes a ``sim.runtime.SimResult``, ``measured_run_meta`` a run of the
real engine (``engine.serve.real_run``), ``served_run_meta`` a ``twinserve serve`` run and
``bench_run_meta`` a benchmark's client (``twinserve bench serve``); the CLI commands, the
sweeps and the validation all call these, so the same kind of run is always described the same
way. All fill one record:
the run's span on its own clock is ``stats.duration_s`` in either world.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from experiments.provenance import provenance
from reports.meta import RunMeta, RunStats, WorkloadSummary

if TYPE_CHECKING:
    from engine.entrypoints.records import EngineRecord
    from engine.llm import RealEngine
    from engine.serve.real_run import RealRunResult
    from sim.runtime import SimResult
    from workload.config import WorkloadConfig
    from workload.stream import Workload


def engine_config_dict(engine_config: Any) -> dict[str, dict[str, Any]]:
    """An ``EngineConfig`` as config.json keeps it: {"scheduler": {...}, "cache": {...}}."""
    sched, cache = engine_config.scheduler, engine_config.cache
    return {
        "scheduler": {k: getattr(sched, k) for k in sched.__dataclass_fields__},
        "cache": {k: getattr(cache, k) for k in cache.__dataclass_fields__},
    }


def workload_summary(workload: Workload) -> WorkloadSummary:
    return WorkloadSummary(
        source=workload.source,
        num_prompts=len(workload),
        request_rate=workload.request_rate,
        burstiness=workload.burstiness,
        max_concurrency=workload.max_concurrency,
    )


def step_costs_label(cfg: Any) -> str:
    """What priced the run's steps, for the report: a GPU without measured kernel tables is
    an estimate (efficiencies carried over), and says so."""
    name = cfg.resolved_cost_model
    if name.startswith("fitted:"):
        return f"fitted cost model {name.split(':', 1)[1]}"
    if cfg.uses_catalog_labels_only:
        return f"{name} cost model"
    gpu = cfg.gpu_spec
    if name == "vllm":
        return f"vLLM step model, {gpu.calibration}"
    if gpu.kernel_tables is None:
        return gpu.calibration  # "estimate: roofline, efficiencies carried over from …"
    return f"roofline, efficiencies {gpu.efficiency_source}"


def simulated_run_meta(result: SimResult) -> RunMeta:
    """A simulated run: its full config (everything needed to rerun it) and counters."""
    cfg, stats = result.config, result.stats
    return RunMeta(
        kind="simulated",
        config=cfg.to_dict(),
        engine_config=engine_config_dict(result.engine_config),
        model_id=cfg.model,
        gpu=cfg.gpu,
        tensor_parallel_size=cfg.tensor_parallel_size,
        cost_model=cfg.resolved_cost_model,
        num_api_servers=cfg.frontend.num_api_servers,
        seed=cfg.seed,
        workload=workload_summary(result.workload),
        stats=RunStats(
            num_requests=stats.num_requests,
            num_rejected=stats.num_rejected,
            num_steps=stats.num_steps,
            duration_s=stats.simulated_time_s,
            wall_time_s=stats.wall_time_s,
            api_server_busy_s=stats.api_server_busy_s,
            output_processor_busy_s=stats.output_processor_busy_s,
            num_bulk_steps=stats.num_bulk_steps,
            num_bulk_runs=stats.num_bulk_runs,
        ),
        reject_reasons=result.reject_reasons,
        notes={"step_costs": step_costs_label(cfg)},
        provenance=provenance(compiled_modules=result.compiled_modules),
        scheduling_policy=result.scheduling_policy,
    )


def measured_run_meta(
    engine: RealEngine,
    workload_cfg: WorkloadConfig,
    workload: Workload,
    result: RealRunResult,
    wall_s: float,
) -> RunMeta:
    """A measured run of ``workload`` (built from ``workload_cfg``) on ``engine``; ``wall_s``
    is the wall time the whole run took (warm-up included). The front end is in-process
    here, so its busy times are 0."""
    args = engine.args
    return RunMeta(
        kind="real",
        config={  # the engine knobs under "engine", as a simulated run's config keeps them
            "engine_args": {k: getattr(args, k) for k in args.__dataclass_fields__
                            if k != "engine"},
            "engine": dataclasses.asdict(args.engine),
            "workload": dataclasses.asdict(workload_cfg),
        },
        engine_config=engine_config_dict(engine.engine_config),
        model_id=str(args.model),
        device=str(engine.executor.device),
        attention_backend=engine.executor.attention_backend,
        num_api_servers=1,
        seed=workload_cfg.seed,
        workload=workload_summary(workload),
        stats=RunStats(
            num_requests=len(workload),
            num_rejected=result.num_rejected,
            num_steps=result.event_log.num_steps,
            duration_s=result.wall_time_s,
            wall_time_s=wall_s,
        ),
        reject_reasons=result.reject_reasons,
        provenance=provenance(),
        scheduling_policy=result.scheduling_policy,
    )


def served_run_meta(
    *,
    mode: str,
    served_model_name: str,
    api_server_count: int,
    serve_config: dict[str, Any],
    engine_meta: dict[str, Any],
    engine_config: Any,
    engine: EngineRecord,
    num_requests: int,
    num_rejected: int,
    num_steps: int,
    duration_s: float,
) -> RunMeta:
    """A run of ``twinserve serve`` (``mode`` "served" on a real engine, "emulated" on the
    simulator's step times), joined from its processes' records at shutdown. The clients
    chose the stream, so the workload is "served" with no rate of its own; ``duration_s`` is
    the span from the first arrival to the last recorded event."""
    if engine_config is None:
        engine_config_json: dict[str, Any] = {
            "scheduler": {"max_model_len": engine.max_model_len},
            "cache": {"num_gpu_blocks": engine.num_gpu_blocks},
        }
    else:
        engine_config_json = engine_config_dict(engine_config)
    return RunMeta(
        kind="real",
        config={"serve": serve_config, **engine_meta},
        engine_config=engine_config_json,
        model_id=served_model_name,
        device=engine.device,
        num_api_servers=api_server_count,
        seed=0,
        workload=WorkloadSummary(source="served", num_prompts=num_requests,
                                 request_rate=float("nan"), burstiness=1.0,
                                 max_concurrency=None),
        stats=RunStats(num_requests=num_requests, num_rejected=num_rejected,
                       num_steps=num_steps, duration_s=duration_s,
                       wall_time_s=duration_s),
        reject_reasons={},
        provenance=provenance(),
        notes={"mode": mode, "backend": "twinserve-serve"},
        scheduling_policy=engine.scheduling_policy or None,
    )


def bench_run_meta(
    *,
    client: dict[str, Any],
    workload_cfg: WorkloadConfig,
    workload: Workload,
    model_id: str,
    num_failed: int,
    duration_s: float,
    label: str | None = None,
) -> RunMeta:
    """A benchmark run by ``twinserve bench serve``: the client's settings and the workload
    config it sent (``config.workload``, what ``twinserve simulate`` takes to simulate the
    identical stream). The server is not known here: its engine config and device are filled
    in when the run is joined with its records."""
    return RunMeta(
        kind="real",
        config={"bench": client, "workload": dataclasses.asdict(workload_cfg)},
        engine_config={},
        model_id=model_id,
        num_api_servers=1,
        seed=workload_cfg.seed,
        workload=workload_summary(workload),
        stats=RunStats(num_requests=len(workload), num_rejected=num_failed, num_steps=0,
                       duration_s=duration_s, wall_time_s=duration_s),
        reject_reasons={},
        provenance=provenance(),
        label=label,
        notes={"mode": "bench-serve", "backend": str(client.get("backend", "openai"))},
    )
