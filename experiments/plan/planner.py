"""Capacity planning: for each candidate layout, the highest rate that meets the SLOs, and the
fewest GPUs that serve a target rate.

A *candidate* is a GPU, a TP size (× PP when the simulator has it), a replica count (DP), an
expert-parallel flag, a weight dtype and values of key engine knobs, applied on top of a base
config that fixes the model and the workload shape (lengths from a trace or a distribution,
burstiness, number of requests). With a GPU budget (``num_gpus``) the candidates are every
layout the budget holds (``layouts.budget_layouts``) and each is first estimated by the cost
model (``estimate``): layouts that cannot run, cannot meet the SLOs even unloaded, or are
clearly beaten on both axes of the front are pruned before any simulation (``prescreen``).

A probe of a candidate at rate r simulates it with the request rate set to r and measures
the SLO attainment: the fraction of all requests that completed and met every SLO
(``records.effective_attainment``); a seed passes when that is ≥ the target (e.g. 0.99).
Seeds run one at a time until the pooled attainment's confidence interval settles the
verdict (``capacity.seeds_needed``). ``capacity.find_capacity`` turns probes into a rate,
starting from the estimate and stepping by ``search.growth``; probes at fractions of the
capacity (``front_fractions``) add the lighter-load points of the Pareto front.

With a target rate, the DP count is solved instead of given: starting from
``ceil(target / one-replica capacity)`` replicas, the DP layout itself is simulated at the
target rate (routers, imbalance and shared prefixes make DP scaling inexact), adding a replica
while it fails and removing one while the smaller layout still passes.

Probes go through the sweep machinery (cache, process pool or Ray); searches of different
candidates run concurrently on threads that share the backend. A ``cost_model_factory`` (a
synthetic model in tests) runs every probe in this process, uncached.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import UserError
from engine.core.interfaces import CostModel
from experiments.plan.capacity import (
    CapacityResult,
    RateProbe,
    SearchSettings,
    find_capacity,
    seeds_needed,
)
from experiments.plan.estimate import Estimate, WorkloadShape
from experiments.sweep.backends import Backend, InlineBackend
from experiments.sweep.expfile import full_config, set_key, set_seed
from experiments.sweep.records import effective_attainment
from experiments.sweep.runner import ResultCache, make_task, run_tasks
from sim.hardware import get_gpu

CostModelFactory = Callable[[Any], CostModel]  # SimConfig -> CostModel
#: The first probe's rate as a fraction of the estimate: the estimate leaves the percentile
#: tails partly to the simulation and runs 5-60% high on the Azure conversation trace.
START_FRACTION = 0.8


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout to evaluate (knobs: canonical config key → value)."""

    gpu: str
    tensor_parallel_size: int
    data_parallel_size: int
    knobs: tuple[tuple[str, Any], ...] = ()
    pipeline_parallel_size: int = 1
    expert_parallel: bool = False  # experts whole over the TP × DP ranks (one engine group)
    quantization: str | None = None  # vLLM --quantization (None: the checkpoint's dtype)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def label(self) -> str:
        knobs = "".join(f" {k.rpartition('.')[2]}={v}" for k, v in self.knobs)
        pp = f" pp{self.pipeline_parallel_size}" if self.pipeline_parallel_size > 1 else ""
        ep = " ep" if self.expert_parallel else ""
        q = f" {self.quantization}" if self.quantization else ""
        return (f"{self.gpu} tp{self.tensor_parallel_size}{pp} dp{self.data_parallel_size}"
                f"{ep}{q}{knobs}")

    def with_replicas(self, n: int) -> Candidate:
        return dataclasses.replace(self, data_parallel_size=n)


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
    num_gpus: int | None = None  # a GPU budget: plan every layout it holds (layouts.py)
    quantizations: tuple[str | None, ...] = (None,)  # budget mode: weight dtypes
    expert_parallel: str = "auto"  # budget mode: "auto", "on" or "off" (MoE models)
    prescreen: bool | None = None  # prune by the estimate (None: in budget mode only)
    start_from_estimate: bool = True  # start each search at the estimate (else rate_start)
    front_fractions: tuple[float, ...] = (0.3,)  # extra probes at these fractions of capacity

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

    @property
    def prunes(self) -> bool:
        return self.prescreen if self.prescreen is not None else self.num_gpus is not None

    def candidates(self) -> list[Candidate]:
        if self.num_gpus is not None:
            return self._budget_candidates()
        dps = (1,) if self.target_rate is not None else self.dp_sizes
        combos = itertools.product(*(values for _, values in self.knobs))
        knob_sets = [tuple(zip((k for k, _ in self.knobs), c, strict=True)) for c in combos]
        return [Candidate(g, tp, dp, ks, pp) for g in self.gpus for tp in self.tp_sizes
                for pp in self.pp_sizes for dp in dps for ks in knob_sets]

    def _budget_candidates(self) -> list[Candidate]:
        """Every unit layout the budget holds, per GPU kind (``layouts.budget_layouts``)."""
        from experiments.plan.layouts import SpaceSpec, budget_layouts
        from sim.model_catalog import get_model

        assert self.num_gpus is not None
        model = get_model(str(self.base.get("model", "meta-llama/Llama-3.1-8B")))
        combos = itertools.product(*(values for _, values in self.knobs))
        knob_sets = [tuple(zip((k for k, _ in self.knobs), c, strict=True)) for c in combos]
        out = []
        for gpu in self.gpus:
            space = SpaceSpec(model, gpu, self.num_gpus, self.pp_sizes, self.quantizations,
                              self.expert_parallel)
            for lay in budget_layouts(space):
                for ks in knob_sets:
                    out.append(Candidate(gpu, lay.tensor_parallel_size, lay.data_parallel_size,
                                         ks, lay.pipeline_parallel_size, lay.expert_parallel,
                                         lay.quantization))
        return out

    def replicas_in_budget(self, candidate: Candidate) -> int:
        """Replicas of ``candidate`` the budget holds (1 for a data-parallel MoE group)."""
        if self.num_gpus is None or candidate.data_parallel_size > 1:
            return 1
        return max(self.num_gpus // candidate.num_gpus, 1)


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
        if candidate.expert_parallel:
            user["enable_expert_parallel"] = True
        if candidate.quantization is not None:
            user["quantization"] = candidate.quantization
        for key, value in candidate.knobs:
            set_key(user, key, value)
        if rate is not None:
            set_key(user, "workload.request_rate", float(rate))
        set_seed(user, seed)
        return full_config(user)

    def probe(self, candidate: Candidate, rate: float) -> RateProbe:
        """``candidate`` at ``rate``: seeds one at a time while the verdict is open."""
        records: list[dict[str, Any]] = []
        for seed in self.spec.seeds:
            task = make_task(self.config(candidate, rate, seed), self.spec.report)
            (record,), stats = run_tasks([task], self.backend, self.cache)
            if record.get("error"):
                raise UserError(f"{candidate.label} at {rate:.4g} req/s: {record['error']}")
            records.append(record)
            with self._lock:
                self.num_sims += stats.num_run
            attainments = [effective_attainment(r) for r in records]
            if not seeds_needed(attainments, [_num_requests(r) for r in records],
                                self.spec.attainment):
                break
        with self._lock:
            self.records[(candidate, rate)] = records
        return RateProbe(rate, tuple(effective_attainment(r) for r in records),
                         self.spec.attainment)

    def search(self, candidate: Candidate, start: float | None = None) -> CapacityResult:
        """The capacity search, from ``start`` (the estimate) or the per-replica start."""
        s = self.spec.search
        begin = start if start is not None else s.rate_start * candidate.data_parallel_size
        scaled = SearchSettings(
            rate_start=min(max(begin, s.rate_min), s.rate_max),
            rate_min=s.rate_min, rate_max=s.rate_max, tolerance=s.tolerance,
            max_probes=s.max_probes, growth=s.growth if start is None else min(s.growth, 1.25),
            accelerate=start is not None,
        )
        return find_capacity(lambda r: self.probe(candidate, r), scaled)


def _num_requests(record: Mapping[str, Any]) -> int:
    return int((record.get("completed") or 0) + (record.get("failed") or 0))


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
    estimate: Estimate | None = None  # the cost model's analytic estimate (when made)
    pruned: str | None = None  # why the pre-screen dropped it (no simulation)


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


def evaluate_candidate(ev: Evaluator, candidate: Candidate,
                       estimate: Estimate | None = None) -> CandidateOutcome:
    try:
        ev.config(candidate, None, ev.spec.seeds[0])  # fits? (raises UserError)
        start = None
        if ev.spec.start_from_estimate and estimate is not None and estimate.capacity_rps > 0:
            start = START_FRACTION * estimate.capacity_rps
        capacity = ev.search(candidate, start)
        if capacity.max_rate > 0:
            for fraction in ev.spec.front_fractions:  # lighter-load points of the front
                ev.probe(candidate, fraction * capacity.max_rate)
        if ev.spec.target_rate is None:
            return CandidateOutcome(candidate, capacity, estimate=estimate)
        n, probe, status = solve_replicas(ev, candidate, capacity, ev.spec.target_rate)
        return CandidateOutcome(candidate, capacity, None, n, probe, status, estimate)
    except UserError as exc:
        return CandidateOutcome(candidate, None, str(exc), estimate=estimate)


def prescreen(spec: PlanSpec, candidates: Sequence[Candidate], shape: WorkloadShape | None,
              factory: CostModelFactory | None = None,
              ) -> tuple[dict[Candidate, Estimate], dict[Candidate, str]]:
    """(estimates, prune reasons) of the candidates (module docstring). Without a workload
    shape nothing is estimated; without ``spec.prunes`` nothing is pruned."""
    from experiments.plan.estimate import dominated, estimate_config, slo_unreachable

    estimates: dict[Candidate, Estimate] = {}
    reasons: dict[Candidate, str] = {}
    if shape is None:
        return estimates, reasons
    ev = Evaluator(spec, InlineBackend(), ResultCache(None))
    for c in candidates:
        try:
            estimates[c] = estimate_config(ev.config(c, None, spec.seeds[0]),
                                           dict(spec.slos_ms), shape, factory, spec.attainment)
        except UserError as exc:
            reasons[c] = f"cannot run: {exc}"
    if not spec.prunes:
        return estimates, {}
    for c, est in estimates.items():
        why = slo_unreachable(est, dict(spec.slos_ms))
        if why is not None:
            reasons[c] = f"SLO out of reach (estimate): {why}"
    alive = [c for c in estimates if c not in reasons]
    for c, by in zip(alive, dominated([estimates[c] for c in alive]), strict=True):
        if by is not None:
            o, e = alive[by], estimates[c]
            mine = (f"{e.tokens_per_s_per_gpu:.0f} at {e.tokens_per_s_per_user:.1f}"
                    if e.capacity_rps > 0 else f"no rate meeting the SLOs ({e.limit})")
            reasons[c] = (f"dominated (estimate): {o.label} serves "
                          f"{estimates[o].tokens_per_s_per_gpu:.0f} tok/s/GPU at "
                          f"{estimates[o].tokens_per_s_per_user:.1f} tok/s/user vs {mine}")
    return estimates, reasons


def run_plan(
    spec: PlanSpec,
    backend: Backend,
    cache: ResultCache,
    *,
    cost_model_factory: CostModelFactory | None = None,
    on_done: Callable[[CandidateOutcome], None] | None = None,
    shape: WorkloadShape | None = None,
) -> tuple[list[CandidateOutcome], Evaluator]:
    """Estimate and pre-screen every candidate (with a workload ``shape``), then search the
    survivors (concurrently when the backend has several workers)."""
    ev = Evaluator(spec, backend, cache, cost_model_factory)
    candidates = spec.candidates()
    estimates, pruned = prescreen(spec, candidates, shape, cost_model_factory)
    alive = [c for c in candidates if c not in pruned]
    threads = 1 if ev.backend.workers == 1 else min(max(len(alive), 1),
                                                     2 * ev.backend.workers)

    def one(c: Candidate) -> CandidateOutcome:
        if c in pruned:
            outcome = CandidateOutcome(c, None, pruned[c], estimate=estimates.get(c),
                                       pruned=pruned[c])
        else:
            outcome = evaluate_candidate(ev, c, estimates.get(c))
        if on_done is not None:
            on_done(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        outcomes = list(pool.map(one, candidates))
    return outcomes, ev


def seeds_mean(records: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else math.nan
