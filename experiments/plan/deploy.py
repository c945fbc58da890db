"""The recommended deployment, simulated as a whole before it is recommended.

The recommendation is the searched layout with the highest SLO-meeting rate per GPU (ties:
the lower p99 TTFT). Capacity searches probe one unit (one engine, or one expert-parallel
group); a deployment runs several units behind the router, whose imbalance, burstiness and
queueing a per-unit answer does not see. So:

* with a target rate, the replica count was already solved by simulating the replicas at
  the target (``planner.solve_replicas``), and that simulation is the verification;
* with a GPU budget, the budget's replicas are simulated together at ``replicas ×`` the unit's
  capacity, with the workload's request count scaled by the replicas (the same duration per
  replica); when that fails, the rate steps down by 5% (at most 4 times) and the deployment is
  recommended at the highest rate it met. A MoE model's unit is already the budget's whole
  data-parallel group, which its search simulated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiments.plan.capacity import RateProbe
from experiments.plan.planner import Candidate, CandidateOutcome, Evaluator, PlanSpec, seeds_mean

#: Rate steps tried when the whole deployment misses the SLOs at the units' summed capacity.
BACKOFF = (0.95, 0.9, 0.85, 0.8)


@dataclass(frozen=True, slots=True)
class Deployment:
    """The recommended deployment and its whole-deployment simulation."""

    unit: Candidate  # the searched layout
    candidate: Candidate  # the deployment simulated (replicas as data-parallel engines)
    replicas: int
    predicted_rate: float  # replicas × the unit's capacity (or the target rate)
    rate: float  # the highest rate the whole deployment met (0: none)
    probe: RateProbe | None
    status: str  # "verified", "backed_off" (met at a lower rate), "failed"
    records: tuple[dict[str, Any], ...] = ()

    @property
    def num_gpus(self) -> int:
        return self.candidate.num_gpus

    def metric(self, key: str) -> float:
        return seeds_mean(self.records, key)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Output tokens/s per GPU of serving every arrival at the verified rate (the
        measured output throughput when no rate was met)."""
        if self.rate <= 0:
            return self.metric("output_throughput") / self.num_gpus
        from experiments.plan.front import served_throughput

        return served_throughput(self.records, self.rate) / self.num_gpus

    @property
    def tokens_per_s_per_user(self) -> float:
        tpot = self.metric("mean_tpot_ms")
        return 1000.0 / tpot if tpot > 0 else math.nan


def best_outcome(outcomes: Sequence[CandidateOutcome], ev: Evaluator) -> CandidateOutcome | None:
    """The searched layout with the highest SLO-meeting rate per GPU."""
    serving = [o for o in outcomes if o.capacity is not None and o.capacity.max_rate > 0]
    if not serving:
        return None

    def key(o: CandidateOutcome) -> tuple[float, float]:
        assert o.capacity is not None
        records = ev.records.get((o.candidate, o.capacity.max_rate), [])
        return (o.capacity.max_rate / o.candidate.num_gpus,
                -seeds_mean(records, "p99_ttft_ms") if records else 0.0)

    return max(serving, key=key)


def recommend(spec: PlanSpec, ev: Evaluator,
              outcomes: Sequence[CandidateOutcome]) -> Deployment | None:
    """The best layout's deployment, simulated as a whole (module docstring)."""
    best = best_outcome(outcomes, ev)
    if best is None or best.capacity is None:
        return None
    unit = best.candidate
    if spec.target_rate is not None:
        if best.replicas is None or best.target_probe is None:
            return None
        layout = unit.with_replicas(best.replicas)
        records = ev.records.get((layout, best.target_probe.rate), [])
        ok = best.target_status == "ok"
        return Deployment(unit, layout, best.replicas, spec.target_rate,
                          spec.target_rate if ok else 0.0, best.target_probe,
                          "verified" if ok else "failed", tuple(records))
    replicas = spec.replicas_in_budget(unit)
    predicted = best.capacity.max_rate * replicas
    layout = unit.with_replicas(replicas) if unit.data_parallel_size == 1 else unit
    if layout == unit:  # the unit is the deployment: its search already simulated it whole
        probe = best.capacity.best_probe
        records = ev.records.get((unit, probe.rate), [])
        return Deployment(unit, unit, 1, predicted, probe.rate, probe, "verified",
                          tuple(records))
    whole = _scaled_evaluator(spec, ev, replicas)
    for i, factor in enumerate((1.0, *BACKOFF)):
        rate = predicted * factor
        probe = whole.probe(layout, rate)
        if probe.feasible:
            records = whole.records.get((layout, rate), [])
            ev.num_sims += whole.num_sims
            return Deployment(unit, layout, replicas, predicted, rate, probe,
                              "verified" if i == 0 else "backed_off", tuple(records))
    ev.num_sims += whole.num_sims
    records = whole.records.get((layout, rate), [])
    return Deployment(unit, layout, replicas, predicted, 0.0, probe, "failed", tuple(records))


def _scaled_evaluator(spec: PlanSpec, ev: Evaluator, replicas: int) -> Evaluator:
    """An evaluator whose workload has ``replicas`` times the requests (same backend)."""
    base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.base.items()}
    work = dict(base.get("workload") or {})
    if work.get("num_prompts"):
        work["num_prompts"] = int(work["num_prompts"]) * replicas
    base["workload"] = work
    whole = Evaluator(dataclasses.replace(spec, base=base), ev.backend, ev.cache)
    return whole
