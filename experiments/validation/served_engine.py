"""The engine ``twinserve validate`` puts behind a real server: profiled in place, recorded.

``ProfiledEngineFactory`` is an ``EngineFactory`` (``engine.entrypoints.engine_proc``) for
``twinserve serve --profile-out … --step-shapes-out … --engine-cpus …``. Inside the EngineCore
process, before the server accepts a request, it

1. pins the process to ``cpu_affinity`` (before torch starts its threads, which inherit it) and
   fixes torch's thread count;
2. builds and warms up the engine as ``RealEngineFactory`` does;
3. profiles it there, on the very executor that will serve: the step grid (the shapes whose KV
   blocks fit the served cache), the wake-up probe (a step after the thread slept) and the
   speed probe, written as a profile CSV and its ``.meta.json`` (``experiments.validation.
   profiling.ProfileFiles``; ``twinserve validate`` adds the rows it measures through HTTP);
4. serves through ``RecordingServedEngine``, which writes every served step's full batch shape
   and measured execute time (``step_shapes.csv``, ``experiments.validation.runs``) when the
   server shuts down — what the stage records lack and a replay of the measured steps needs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.serve.engines import ServedRealEngine

if TYPE_CHECKING:
    from engine.llm import EngineArgs, RealEngine


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    """What to profile inside the server, and where to write it."""

    csv_path: str
    grid: str = "full"  # experiments.validation.profiling.make_grid's names
    seed: int = 0


class RecordingServedEngine(ServedRealEngine):
    """A served engine that writes its executed steps' shapes and times at shutdown, and, when
    it starts, what the served engine is (``X.engine.json`` beside them: KV blocks, device,
    dtype, vocabulary) for a client that must size its load before the records exist."""

    def __init__(self, engine: RealEngine, step_shapes_path: str | None) -> None:
        super().__init__(engine)
        self._path = step_shapes_path
        if step_shapes_path is not None:
            info = {"num_gpu_blocks": engine.engine_config.cache.num_gpu_blocks,
                    "block_size": engine.engine_config.cache.block_size,
                    "max_model_len": engine.engine_config.scheduler.max_model_len,
                    "device": str(engine.executor.device),
                    "dtype": str(engine.executor.dtype).removeprefix("torch."),
                    "vocab_size": engine.model_config.vocab_size}
            engine_info_path(step_shapes_path).write_text(json.dumps(info, indent=1) + "\n")

    def shutdown(self) -> None:
        if self._path is not None:
            from experiments.validation.runs import step_shape_rows, write_step_shapes

            write_step_shapes(Path(self._path), step_shape_rows(self.executor.step_timings))
        super().shutdown()


def engine_info_path(step_shapes_path: str | Path) -> Path:
    """Where ``RecordingServedEngine`` describes the served engine."""
    p = Path(step_shapes_path)
    return p.with_name(p.stem + ".engine.json")


@dataclass(frozen=True, slots=True)
class ProfiledEngineFactory:
    """Builds, pins, profiles and records the served engine (see the module docstring)."""

    args: EngineArgs
    cpu_threads: int = 1
    cpu_affinity: tuple[int, ...] | None = None
    profile: ProfileRequest | None = None
    step_shapes_path: str | None = None

    def build(self, clock: Callable[[], float],
              data_parallel_rank: int = 0) -> RecordingServedEngine:
        if self.cpu_affinity:
            os.sched_setaffinity(0, self.cpu_affinity)
        import torch

        if self.cpu_threads:
            torch.set_num_threads(self.cpu_threads)
        from engine.serve.real_run import warm_up

        engine = self.args.build(data_parallel_rank=data_parallel_rank)
        warm_up(engine)
        if self.profile is not None:
            profile_in_place(engine, self.args, self.profile)
        engine.executor.step_timings.clear()  # the served steps only
        return RecordingServedEngine(engine, self.step_shapes_path)


def profile_in_place(engine: RealEngine, engine_args: EngineArgs,
                     request: ProfileRequest) -> None:
    """The step grid, wake-up and speed probes on ``engine``'s own executor (its KV cache as
    sized for serving: the grid keeps the shapes that fit it)."""
    import time

    import torch

    from engine.worker.profiler import StepProfiler, speed_probe, write_profile_csv
    from experiments.provenance import provenance
    from experiments.validation.profiling import (
        ProfileFiles,
        make_grid,
        model_geometry,
        plain_json,
        wakeup_rows,
    )

    files = ProfileFiles.of(request.csv_path)
    grid = make_grid(request.grid, engine_args, request.seed)
    executor = engine.executor
    block_size = executor.block_size
    shapes = [s for s in grid.shapes() if s.num_blocks(block_size) + 1 <= executor.num_gpu_blocks]
    t0 = time.perf_counter()
    probes = [speed_probe(executor)]
    rows = StepProfiler(executor).measure(shapes, grid)
    rows += wakeup_rows(engine, grid)
    probes.append(speed_probe(executor))
    write_profile_csv(files.csv, rows)
    ratios = [r.stats.cpu_ratio for r in rows if r.shape is not None]
    meta: dict[str, Any] = {
        "model": str(engine_args.model), "device": str(executor.device),
        "dtype": str(executor.dtype).removeprefix("torch."),
        "attention_backend": executor.attention_backend,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "geometry": dataclasses.asdict(model_geometry(engine)), "grid": request.grid,
        "grid_params": dataclasses.asdict(grid), "grid_seconds": time.perf_counter() - t0,
        "num_grid_shapes": len(shapes), "profiled_in": "the server's EngineCore process",
        "num_gpu_blocks": executor.num_gpu_blocks,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "cpu_ratio_median": sorted(ratios)[len(ratios) // 2] if ratios else None,
        "speed_probe_s": sum(probes) / len(probes), "speed_probes_s": probes,
        "engine_args": {k: getattr(engine_args, k) for k in engine_args.__dataclass_fields__},
        **dataclasses.asdict(provenance()),
    }
    files.meta.write_text(json.dumps(plain_json(meta), indent=1) + "\n")
