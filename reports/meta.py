"""Run metadata (``config.json``) and JSON that never chokes on numpy values.

A run's metadata is one frozen record, ``RunMeta``, whatever the world that ran it; the
experiments build it (``experiments.run_meta``) and ``RunMeta.to_dict`` is the ``config.json``
object saved next to the tables (a run directory's metadata is read back as that plain dict).
Its keys:

======================  ==========================================================================
``kind``                "simulated" or "real"
``config``              the run's full config dict (``SimConfig.to_dict()`` for simulated runs; the
                        engine's own arguments, its knobs under ``engine`` and the workload for
                        real ones): ``model``, ``seed``, ``frontend.num_api_servers``,
                        ``workload.*`` …
``engine_config``       the resolved engine config (``max_num_batched_tokens``, KV blocks …)
``model_id``            the model (catalog name or checkpoint directory)
``gpu``, ``tensor_parallel_size``  simulated runs: the layout
``cost_model``          simulated runs: the cost model that timed the steps ("auto" resolved)
``device``, ``attention_backend``  real runs: where and how it ran
``workload``            request_rate, burstiness, max_concurrency, source (override ``config``)
``stats``               run counters (``RunStats``): ``duration_s`` (the run's span on its own
                        clock, simulated or wall), ``wall_time_s``, ``api_server_busy_s`` …
``reject_reasons``      req_id -> why the request was refused (the admission rule, or shed by the
                        scheduling policy)
``scheduling_policy``   the policy that scheduled: ``name``, ``class``, ``options``, and
                        ``bulk_fast_path`` (on / limited / off, and why)
``seed``                the run's seed
``version``             twinserve's version
``git_commit``          the source tree's commit (None if unknown)
``date``                ``YYYYmmdd-HHMMSS`` when the run was described (set on write if absent)
``python``              the Python version
``compiled_modules``    how many modules ran compiled (``twinserve compile``; 0 = Python sources;
                        a sharded run: the fewest in any of its workers)
``label``               a name for comparisons (optional)
======================  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
    """``value`` as strict JSON in ``path``, written atomically (a reader sees the old file or
    the whole new one)."""
    from engine.output_dir import atomic_write_text

    return atomic_write_text(path, json.dumps(to_jsonable(value), indent=1, allow_nan=False)
                             + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def token_budget(meta: Mapping[str, Any]) -> int | None:
    """The run's ``max_num_batched_tokens`` if the metadata has it."""
    engine = meta.get("engine_config") or {}
    sched = engine.get("scheduler") or engine
    value = sched.get("max_num_batched_tokens") if isinstance(sched, Mapping) else None
    return int(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    """The request stream a run served, as reports name it."""

    source: str  # dataset, file and licence note
    num_prompts: int  # requests in the stream
    request_rate: float  # offered rate, req/s (inf: all at once; NaN: a trace's own times)
    burstiness: float  # gamma shape of the arrivals (1 = Poisson)
    max_concurrency: int | None  # client-side cap on requests in flight


@dataclass(frozen=True, slots=True)
class RunStats:
    """How a run went. Measured-run fields are None for simulated runs and the other way round
    (a None field is left out of ``config.json``)."""

    num_requests: int
    num_rejected: int  # refused by the admission rule or shed by the scheduling policy
    num_steps: int  # engine steps applied
    duration_s: float  # the run's span on its own clock: simulated seconds, or measured seconds
    wall_time_s: float  # wall time the run took (the simulation loop, or the measured run)
    api_server_busy_s: float = 0.0  # front-end CPU time (0 where it is not modelled)
    output_processor_busy_s: float = 0.0  # output-path CPU time (0 where it is not modelled)
    num_bulk_steps: int | None = None  # simulated: steps applied by the exact bulk path
    num_bulk_runs: int | None = None  # simulated: bulk runs applied
    thread_cpu_s: float | None = None  # measured: CPU time of the engine loop's thread
    cpu_share: float | None = None  # measured: that CPU time over the loop's busy wall time
    speed_probe_s: float | None = None  # measured: the machine's pace during the run
    speed_drift: float | None = None  # measured: that pace over the profile's


@dataclass(frozen=True, slots=True)
class Provenance:
    """Stamped into every run: what code ran where, and when."""

    version: str | None  # twinserve's version
    git_commit: str | None  # the checkout's commit (``-dirty`` with uncommitted changes)
    date: str  # YYYYmmdd-HHMMSS
    python: str  # the Python version
    compiled_modules: int  # modules that ran compiled (speed only, never decisions)


RunKind = Literal["simulated", "real"]


@dataclass(frozen=True, slots=True)
class RunMeta:
    """One run's metadata, the same record for both worlds (``config.json``: ``to_dict``)."""

    kind: RunKind
    config: Mapping[str, Any]  # the run's full config, a JSON object (see the module docstring)
    engine_config: Mapping[str, Any]  # the resolved engine config: {"scheduler", "cache"}
    model_id: str
    num_api_servers: int
    seed: int
    workload: WorkloadSummary
    stats: RunStats
    reject_reasons: Mapping[str, str]  # req_id -> why it was refused
    provenance: Provenance
    gpu: str | None = None  # simulated: catalog GPU
    tensor_parallel_size: int | None = None  # simulated
    cost_model: str | None = None  # simulated: the cost model that ran ("auto" resolved)
    device: str | None = None  # real: torch device
    attention_backend: str | None = None  # real: the attention kernels used
    label: str | None = None  # a name for comparisons
    notes: Mapping[str, str | float | None] = field(default_factory=dict)  # tool annotations
    scheduling_policy: Mapping[str, Any] | None = None  # name, class, options, bulk fast path

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` object: keys in the module docstring's order, None-valued
        optional fields (world-specific, label, measured-only stats) left out."""
        out: dict[str, Any] = {"kind": self.kind, "config": dict(self.config),
                               "engine_config": dict(self.engine_config),
                               "model_id": self.model_id}
        for name in ("gpu", "tensor_parallel_size", "cost_model", "device",
                     "attention_backend"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out["num_api_servers"] = self.num_api_servers
        out["seed"] = self.seed
        out["workload"] = dataclasses.asdict(self.workload)
        out["stats"] = {k: v for k, v in dataclasses.asdict(self.stats).items() if v is not None}
        out["reject_reasons"] = dict(self.reject_reasons)
        if self.scheduling_policy is not None:
            out["scheduling_policy"] = dict(self.scheduling_policy)
        out.update(dataclasses.asdict(self.provenance))
        if self.label is not None:
            out["label"] = self.label
        out.update(self.notes)
        return out


def meta_dict(meta: RunMeta | Mapping[str, Any]) -> dict[str, Any]:
    """A run's metadata as the plain dict reports read (a run directory's ``config.json`` comes
    back as one)."""
    return meta.to_dict() if isinstance(meta, RunMeta) else dict(meta)
