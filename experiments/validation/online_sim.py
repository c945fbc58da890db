"""The simulated twins of a served run: the identical stream through the simulator, twice.

* ``fitted`` — the workload config the client sent (same seed: the same lengths, prefixes and
  send times), the served engine's config (KV blocks, budgets, chunking, prefix caching,
  scheduling), the fitted step model (``profile.fitted.json``) and the fitted served-path costs
  (``served_costs``), the profile's wake-up cost included;
* ``replayed`` — the same, except that each step lasts what the measured run's step of that
  batch shape lasted (``sim.cost.replay.ReplayCostModel``; a shape the run never had takes the
  fitted model scaled to the run's own steps: their measured total over its prediction), each
  request's front end takes what its way in took (client send → sent to the engine, less the
  network), requests are sent when the
  client actually sent them, and no wake-up cost is added (measured steps carry it). Its error
  is the structure's; fitted − replayed is the cost model's.

Both write an ordinary simulated run directory (the bulk fast path is off for the replay: its
model keeps count of the measured steps it handed out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import EngineConfig


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    """A simulated twin: its run directory, and for a replay how its steps matched."""

    run_dir: Path
    replay: dict[str, int] | None  # replayed / repeated / fallback step counts


def sim_config(engine_config: EngineConfig, workload_cfg: Any, fitted_path: Path,
               frontend: dict[str, float | int], *, label: str, fast_path: bool) -> Any:
    """The ``SimConfig`` of a served run (catalog-free: a fitted model and explicit blocks)."""
    from engine.core.config import EngineKnobs
    from sim.config import FrontendConfig, SimConfig

    sched, cache = engine_config.scheduler, engine_config.cache
    return SimConfig(
        model=label, gpu="served", num_gpu_blocks=cache.num_gpu_blocks,
        max_model_len=sched.max_model_len,
        engine=EngineKnobs(
            max_num_batched_tokens=sched.max_num_batched_tokens,
            max_num_seqs=sched.max_num_seqs, enable_chunked_prefill=sched.enable_chunked_prefill,
            long_prefill_token_threshold=sched.long_prefill_token_threshold,
            policy=sched.policy, scheduler_reserve_full_isl=sched.scheduler_reserve_full_isl,
            async_scheduling=sched.async_scheduling, block_size=cache.block_size,
            enable_prefix_caching=cache.enable_prefix_caching, watermark=cache.watermark),
        frontend=FrontendConfig(**frontend),  # type: ignore[arg-type]
        workload=workload_cfg,
        cost_model=f"fitted:{fitted_path}", fast_path=fast_path,
    )


def _write(result: Any, out_dir: Path, label: str, notes: dict[str, Any], plots: bool) -> None:
    from experiments.run_meta import simulated_run_meta
    from reports.run_dir import write_run_dir

    meta = dataclasses.replace(simulated_run_meta(result), label=label, notes=notes)
    write_run_dir(out_dir, result.event_log, meta, plots=plots, percentiles=(50, 90, 99),
                  percentile_metrics=("ttft", "tpot", "itl", "e2el"))


def simulate_fitted(engine_config: EngineConfig, workload_cfg: Any, fitted_path: Path,
                    frontend: dict[str, float | int], out_dir: Path, *, model_label: str,
                    plots: bool) -> SimulatedRun:
    """The fitted twin (see the module docstring)."""
    from sim.cost.fitted import FittedCostModel
    from sim.runtime import SimRuntime

    cfg = sim_config(engine_config, workload_cfg, fitted_path, frontend, label=model_label,
                     fast_path=True)
    result = SimRuntime(cfg, cost_model=FittedCostModel.load(fitted_path)).run()
    _write(result, out_dir, "simulated (fitted)", {"twin": "fitted"}, plots)
    return SimulatedRun(out_dir, None)


def simulate_replayed(engine_config: EngineConfig, workload_cfg: Any, fitted_path: Path,
                      frontend: dict[str, float | int], out_dir: Path, *,
                      steps: Sequence[Any], request_frontend_s: np.ndarray,
                      send_times_s: np.ndarray, model_label: str,
                      plots: bool) -> SimulatedRun:
    """The replayed twin: ``steps`` are the measured run's ``StepSample``s (shape, execute
    time), ``request_frontend_s`` each request's measured front-end time (NaN: not measured,
    the fitted cost), ``send_times_s`` the client's sends (0 = the first)."""
    from sim.cost.fitted import FittedCostModel
    from sim.cost.replay import ReplayCostModel
    from sim.runtime import SimRuntime
    from workload.build import build_workload

    fitted = FittedCostModel.load(fitted_path)
    measured = sum(s.execute_time_s for s in steps)
    predicted = sum(fitted.step_time(s.shape).total_s for s in steps)
    scale = measured / predicted if predicted > 0 and measured > 0 else 1.0
    replay = ReplayCostModel([(s.shape, s.execute_time_s) for s in steps], fitted.scaled(scale))
    values = {**frontend, "idle_wakeup_s": 0.0, "idle_wakeup_ramp_s": 0.0}
    cfg = sim_config(engine_config, workload_cfg, fitted_path, values, label=model_label,
                     fast_path=False)
    workload = build_workload(workload_cfg)
    workload = dataclasses.replace(workload, send_time_s=np.asarray(send_times_s, dtype=float))
    fallback = (frontend["request_overhead_s"] + frontend["tokenize_s_per_token"]
                * workload.prompt_lens.astype(float))
    costs = np.where(np.isfinite(request_frontend_s), request_frontend_s, fallback)
    result = SimRuntime(cfg, workload=workload, cost_model=replay,
                        request_frontend_s=costs.tolist()).run()
    stats = dataclasses.asdict(replay.stats)
    _write(result, out_dir, "simulated (replayed steps)",
           {"twin": "replayed", "fallback_scale": scale,
            **{f"steps_{k}": v for k, v in stats.items()}}, plots)
    return SimulatedRun(out_dir, stats)
