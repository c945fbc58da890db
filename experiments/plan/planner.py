"""Capacity planning: for each candidate layout, the highest rate that meets the SLOs, and the
fewest GPUs that serve a target rate.

A *candidate* is a GPU, a TP size, a PP size, a replica count (DP) and values of key engine
knobs, applied
on top of a base config that fixes the model and the workload shape (lengths from a trace or a
distribution, burstiness, number of requests). A probe of a candidate at rate r simulates it
once per seed with the request rate set to r and measures the SLO attainment: the fraction of
all requests that completed and met every SLO (``records.effective_attainment``); a seed passes
when that is ≥ the target (e.g. 0.99). ``capacity.find_capacity`` turns probes into a rate.

With a target rate, the DP count is solved instead of given: starting from
``ceil(target / one-replica capacity)`` replicas, the DP layout itself is simulated at the
target rate (routers, imbalance and shared prefixes make DP scaling inexact), adding a replica
while it fails and removing one while the smaller layout still passes.

Probes go through the sweep machinery (cache, process pool or Ray); searches of different
candidates run concurrently on threads that share the backend. A ``cost_model_factory`` (a
synthetic model in tests) runs every probe in this process, uncached.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import UserError
from engine.core.interfaces import CostModel
from experiments.plan.capacity import CapacityResult, RateProbe, SearchSettings, find_capacity
from experiments.sweep.backends import Backend, InlineBackend
from experiments.sweep.expfile import full_config, set_key, set_seed
from experiments.sweep.records import effective_attainment
from experiments.sweep.runner import ResultCache, make_task, run_tasks
from sim.hardware import get_gpu

CostModelFactory = Callable[[Any], CostModel]  # SimConfig -> CostModel


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout to evaluate (knobs: canonical config key → value)."""

    gpu: str
    tensor_parallel_size: int
    data_parallel_size: int
    knobs: tuple[tuple[str, Any], ...] = ()
    pipeline_parallel_size: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def label(self) -> str:
        knobs = "".join(f" {k.rpartition('.')[2]}={v}" for k, v in self.knobs)
        pp = f" pp{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        return (f"{self.gpu} tp{self.tensor_parallel_size}{pp} dp{self.data_parallel_size}"
                f"{knobs}")

    def with_replicas(self, n: int) -> Candidate:
        return Candidate(self.gpu, self.tensor_parallel_size, n, self.knobs,
                         self.pipeline_parallel_size)


@dataclass(frozen=True, slots=True)
class PlanSpec:
    """What to plan for: the candidates' space, the workload, the SLOs and the search."""

    base: Mapping[str, Any]  # user-level SimConfig dict: model, workload shape, fixed knobs
    gpus: tuple[str, ...]
    tp_sizes: tuple[int, ...] = (1,)
    dp_sizes: tuple[int, ...] = (1,)  # ignored with a target rate (the DP count is solved)
    pp_sizes: tuple[int, ...] = (1,)  # pipeline stages per replica
    knobs: tuple[tuple[str, tuple[Any, ...]], ...] = ()  # canonical key → candidate values
    slos_ms: Mapping[str, float] = field(default_factory=lambda: {"ttft": 500.0, "tpot": 50.0})
    attainment: float = 0.99  # fraction of requests that must meet every SLO
    seeds: tuple[int, ...] = (0, 1, 2)
    search: SearchSettings = field(default_factory=SearchSettings)
    target_rate: float | None = None  # req/s to serve with the fewest GPUs
    max_replicas: int = 16
    gpu_prices: Mapping[str, float] = field(default_factory=dict)  # $ per GPU-hour

    def __post_init__(self) -> None:
        if not self.gpus or not self.tp_sizes or not self.dp_sizes or not self.seeds:
            raise UserError("plan needs at least one GPU, TP size, DP size and seed")
        if any(n < 1 for n in (*self.tp_sizes, *self.dp_sizes, *self.pp_sizes)):
            raise UserError("TP, PP and DP sizes must be >= 1")
        if any(tp & (tp - 1) for tp in self.tp_sizes):
            raise UserError(f"TP sizes must be powers of two, got {list(self.tp_sizes)}")
        if not str(self.base.get("cost_model", "")).startswith("fitted:"):
            for gpu in self.gpus:  # names outside the catalog only label a fitted model's runs
                get_gpu(gpu)
        if not self.slos_ms:
            raise UserError("plan needs at least one SLO, e.g. --slo ttft:500 tpot:50")
        if not 0 < self.attainment <= 1:
            raise UserError(f"attainment must be in (0, 1] (or a percentage), got "
                            f"{self.attainment}")
        if self.target_rate is not None and not 0 < self.target_rate < math.inf:
            raise UserError(f"target rate must be a finite number > 0, got {self.target_rate}")
        if self.max_replicas < 1:
            raise UserError(f"max replicas must be >= 1, got {self.max_replicas}")
        unknown = sorted(set(self.gpu_prices) - set(self.gpus))
        if unknown:
            raise UserError(f"--gpu-price for GPU(s) not planned: {', '.join(unknown)}; "
                            f"candidates: {', '.join(self.gpus)}")

    @property
    def report(self) -> dict[str, Any]:
        return {"goodput": dict(self.slos_ms), "percentiles": [50.0, 90.0, 99.0],
                "percentile_metrics": ["ttft", "tpot", "itl", "e2el"]}

    def candidates(self) -> list[Candidate]:
        dps = (1,) if self.target_rate is not None else self.dp_sizes
        combos = itertools.product(*(values for _, values in self.knobs))
        knob_sets = [tuple(zip((k for k, _ in self.knobs), c, strict=True)) for c in combos]
        return [Candidate(g, tp, dp, ks, pp) for g in self.gpus for tp in self.tp_sizes
                for pp in self.pp_sizes for dp in dps for ks in knob_sets]


class Evaluator:
    """Probes candidates at rates: one task per seed, through the backend and the cache."""

    def __init__(
        self, spec: PlanSpec, backend: Backend, cache: ResultCache,
        cost_model_factory: CostModelFactory | None = None,
    ) -> None:
        self.spec = spec
        if cost_model_factory is not None:
            backend, cache = InlineBackend(_with_cost_model(cost_model_factory)), ResultCache(None)
        self.backend = backend
        self.cache = cache
        self.records: dict[tuple[Candidate, float], list[dict[str, Any]]] = {}
        self.num_sims = 0
        self._lock = threading.Lock()

    def config(self, candidate: Candidate, rate: float | None, seed: int) -> dict[str, Any]:
        """The full config of ``candidate`` at ``rate`` (validated; raises ``UserError``)."""
        user: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v)
                                for k, v in self.spec.base.items()}
        user.update(gpu=candidate.gpu, tensor_parallel_size=candidate.tensor_parallel_size,
                    data_parallel_size=candidate.data_parallel_size)
        if candidate.pipeline_parallel_size > 1 or "pipeline_parallel_size" in user:
            user["pipeline_parallel_size"] = candidate.pipeline_parallel_size
        for key, value in candidate.knobs:
            set_key(user, key, value)
        if rate is not None:
            set_key(user, "workload.request_rate", float(rate))
        set_seed(user, seed)
        return full_config(user)

    def probe(self, candidate: Candidate, rate: float) -> RateProbe:
        tasks = [make_task(self.config(candidate, rate, s), self.spec.report)
                 for s in self.spec.seeds]
        records, stats = run_tasks(tasks, self.backend, self.cache)
        errors = [r["error"] for r in records if r.get("error")]
        if errors:
            raise UserError(f"{candidate.label} at {rate:.4g} req/s: {errors[0]}")
        with self._lock:
            self.records[(candidate, rate)] = records
            self.num_sims += stats.num_run
        return RateProbe(rate, tuple(effective_attainment(r) for r in records),
                         self.spec.attainment)

    def search(self, candidate: Candidate) -> CapacityResult:
        s = self.spec.search
        scaled = SearchSettings(
            rate_start=min(max(s.rate_start * candidate.data_parallel_size, s.rate_min),
                           s.rate_max),
            rate_min=s.rate_min, rate_max=s.rate_max, tolerance=s.tolerance,
            max_probes=s.max_probes,
        )
        return find_capacity(lambda r: self.probe(candidate, r), scaled)


def _with_cost_model(factory: CostModelFactory) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    def run(task: Mapping[str, Any]) -> dict[str, Any]:
        from experiments.sweep.records import simulate_record
        from sim.config import SimConfig

        model = factory(SimConfig.from_dict(dict(task["config"])))
        return simulate_record(task["config"], task["report"], cost_model=model)

    return run


@dataclass(frozen=True, slots=True)
class CandidateOutcome:
    """One candidate's search (and, with a target rate, its replica count)."""

    candidate: Candidate
    capacity: CapacityResult | None  # None when the candidate is invalid
    error: str | None = None  # why the candidate cannot run (does not fit …)
    replicas: int | None = None  # target mode: fewest replicas that meet the target
    target_probe: RateProbe | None = None  # target mode: the probe at the chosen replicas
    target_status: str | None = None  # "ok", "infeasible", "over_max_replicas"


def solve_replicas(
    ev: Evaluator, candidate: Candidate, capacity: CapacityResult, target: float
) -> tuple[int | None, RateProbe | None, str]:
    """Fewest replicas of ``candidate`` whose simulated DP layout meets ``target`` req/s.

    Starts at the estimate n0 = ceil(target / one-replica capacity); checks n0 − 1 (or n0 + 1)
    first, since the answer is usually next to the estimate, then gallops and bisects,
    assuming more replicas never serve less."""
    if capacity.status == "infeasible":
        return None, None, "infeasible"
    limit = ev.spec.max_replicas
    n0 = 1 if math.isinf(capacity.fail_rate) else math.ceil(target / capacity.max_rate)
    n0 = max(1, min(n0, limit))
    probes: dict[int, RateProbe] = {}

    def passes(n: int) -> bool:
        probes[n] = ev.probe(candidate.with_replicas(n), target)
        return probes[n].feasible

    if passes(n0):
        lo, hi = 0, n0  # lo fails (0 replicas serve nothing), hi passes
        if n0 > 1:
            if passes(n0 - 1):
                hi = n0 - 1
            else:
                lo = n0 - 1
    else:
        lo, n = n0, n0
        while True:
            if n >= limit:
                return n, probes[n], "over_max_replicas"
            n = min(limit, n + 1 if n == n0 else 2 * n - n0)
            if passes(n):
                break
            lo = n
        hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return hi, probes[hi], "ok"


def evaluate_candidate(ev: Evaluator, candidate: Candidate) -> CandidateOutcome:
    try:
        ev.config(candidate, None, ev.spec.seeds[0])  # fits? (raises UserError)
        capacity = ev.search(candidate)
        if ev.spec.target_rate is None:
            return CandidateOutcome(candidate, capacity)
        n, probe, status = solve_replicas(ev, candidate, capacity, ev.spec.target_rate)
        return CandidateOutcome(candidate, capacity, None, n, probe, status)
    except UserError as exc:
        return CandidateOutcome(candidate, None, str(exc))


def run_plan(
    spec: PlanSpec,
    backend: Backend,
    cache: ResultCache,
    *,
    cost_model_factory: CostModelFactory | None = None,
    on_done: Callable[[CandidateOutcome], None] | None = None,
) -> tuple[list[CandidateOutcome], Evaluator]:
    """Search every candidate (concurrently when the backend has several workers)."""
    ev = Evaluator(spec, backend, cache, cost_model_factory)
    candidates = spec.candidates()
    threads = 1 if ev.backend.workers == 1 else min(len(candidates), 2 * ev.backend.workers)

    def one(c: Candidate) -> CandidateOutcome:
        outcome = evaluate_candidate(ev, c)
        if on_done is not None:
            on_done(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        outcomes = list(pool.map(one, candidates))
    return outcomes, ev


def seeds_mean(records: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else math.nan
