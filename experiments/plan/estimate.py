"""The cost model's own capacity estimate of a layout: the analytic pre-screen and the rate
search's starting point.

Steady state at ``λ`` requests/s per engine, mean prompt ``I``, mean output ``O``: by Little's
law ``B = λ·O·t`` requests decode and ``a = λ·t`` prompts arrive per step of ``t`` seconds.
Prompts come whole: below one per step, a fraction ``a`` of the steps carries a mean prompt and
the rest decode only, ``t = (1 − a)·step(B, 0) + a·step(B, I)`` (above, ``t = step(B, a·I)``),
where ``step`` is the cost model's time for ``B`` decodes at the mean context ``I + O/2`` plus
a chunk half way through its prompt; ``t`` is solved by fixed-point iteration.

The layout meets the SLOs at ``λ`` when

* TPOT: the attainment quantile of per-request TPOT is within the SLO. A request of ``n``
  outputs shares its steps with ``K ~ Poisson(a·n)`` prompt-carrying steps, each adding
  ``Δ(prompt)`` to a decode-only step ``t0``: its TPOT is ``t0 + ΣΔ/n`` (a fixed-seed Monte
  Carlo over the workload's output and prompt lengths: short outputs and long prompts make the
  tail);
* TTFT: the long (99th percentile) prompt's prefill in the budget's chunks plus the quantile of
  its wait is within the SLO. Prompt tokens are served at ``(budget − B) / t`` tokens/s, so
  prompts queue like an M/D/1 queue of service ``s = I·t / (budget − B)`` and load
  ``ρ = λ·s``; its wait's quantile ``q`` is taken as half the M/M/1 one,
  ``s·ln(ρ / (1 − q)) / (2·(1 − ρ))``;
* ``B`` requests fit the KV cache, ``max_num_seqs`` and the token budget.

The capacity estimate is the largest such ``λ`` (bisection). Burstier arrivals, preemption and
the chunking of long prompts are left to the simulation: the estimate is a starting point and
a filter, never an answer (it runs 5-60% above the simulated capacity on the Azure conversation
trace, the more the fewer GPUs).

Pre-screen (``planner.prescreen``): a layout is dropped when it cannot run (memory), when even
a lone request misses an SLO by the margin, or when another layout's estimate beats it by the
margin on both throughput per GPU and tokens per second per user.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.config import EngineConfig
from engine.core.errors import UserError
from engine.core.interfaces import CostModel
from engine.core.outputs import BatchShape

#: A layout is pruned only when clearly worse: by this factor on both axes, or its lone
#: request's latency this factor over an SLO.
PRUNE_MARGIN = 1.25
#: Requests drawn for the TPOT tail's Monte Carlo (fixed seed: the estimate is deterministic).
TAIL_DRAWS = 4000


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """The lengths the estimate needs (from the base config's workload, seed 0)."""

    mean_input: float
    mean_output: float
    long_input: float  # the 99th percentile prompt: the one the TTFT SLO's tail is about
    output_strata: tuple[float, ...] = ()  # output lengths at 20 evenly spaced quantiles
    prompt_strata: tuple[float, ...] = ()  # prompt lengths at the same quantiles


@dataclass(frozen=True, slots=True)
class Estimate:
    """One layout's analytic estimate (rates for the whole unit: every engine of it)."""

    capacity_rps: float  # highest rate meeting the SLOs (0: none)
    light_tpot_s: float  # a lone request's decode step
    light_ttft_s: float  # a lone long (99th percentile) prompt's prefill
    tokens_per_s_per_gpu: float  # output tokens/s per GPU at capacity
    tokens_per_s_per_user: float  # 1 / a lone request's decode step (the front's fast end)
    limit: str  # what bounds the capacity: "tpot", "ttft", "kv", "max_num_seqs", "slo"


def workload_shape(workload: Any) -> WorkloadShape:
    """Mean prompt and output lengths, and the 99th percentile prompt, of a ``Workload``."""
    import numpy as np

    prompts, outputs = workload.prompt_lens, workload.output_lens
    qs = np.arange(2.5, 100, 5)
    return WorkloadShape(float(prompts.mean()), float(outputs.mean()),
                         float(np.percentile(prompts, 99)),
                         tuple(float(x) for x in np.percentile(outputs, qs)),
                         tuple(float(x) for x in np.percentile(prompts, qs)))


class _Steady:
    """Steady-state step times of one engine under a cost model."""

    def __init__(self, model: CostModel, engine: EngineConfig, shape: WorkloadShape) -> None:
        self.model = model
        self.budget = engine.scheduler.max_num_batched_tokens
        self.max_seqs = engine.scheduler.max_num_seqs
        self.kv_tokens = (engine.cache.num_gpu_blocks - 1) * engine.cache.block_size
        self.shape = shape

    def step_s(self, decodes: int, prefill_tokens: int) -> float:
        s = self.shape
        ctx = int(s.mean_input + s.mean_output / 2)
        chunks: tuple[int, ...] = (prefill_tokens,) if prefill_tokens > 1 else ()
        contexts = (int(s.mean_input / 2),) if chunks else ()
        num_reqs = decodes + len(chunks)
        if num_reqs == 0:
            return 0.0
        batch = BatchShape(num_reqs, decodes + sum(chunks), chunks, contexts, decodes,
                           decodes * ctx, ctx if decodes else 0, num_reqs)
        return self.model.step_time(batch).total_s

    def mean_step_s(self, decodes: int, arrivals: float) -> float:
        """Mean step time when ``arrivals`` prompts arrive per step: prompts come whole, so
        below one per step a fraction ``arrivals`` of the steps carries a whole mean prompt
        (decode-only steps are cheap, memory-bound ones; a prompt's step is compute-bound)."""
        prompt = round(self.shape.mean_input)
        if arrivals >= 1.0:
            return self.step_s(decodes, round(arrivals * prompt))
        return (1.0 - arrivals) * self.step_s(decodes, 0) + arrivals * self.step_s(
            decodes, prompt)

    def prefill_s(self, decodes: int) -> float:
        """The long (99th percentile) prompt's prefill in the chunks the budget leaves beside
        ``decodes`` decodes."""
        prompt = self.shape.long_input
        room = max(self.budget - decodes, 1)
        chunk = int(min(room, prompt))
        steps = math.ceil(prompt / max(chunk, 1))
        return steps * self.step_s(decodes, max(chunk, 2))

    def tpot_tail_s(self, decodes: int, arrivals: float, quantile: float) -> float:
        """The ``quantile`` of per-request TPOT: a request decoding ``n`` tokens shares its
        steps with ``K ~ Poisson(a·n)`` prompt-carrying steps, each prompt (drawn from the
        workload's lengths) adding ``Δ(prompt)`` to a decode-only step ``t0``, so its TPOT is
        ``t0 + ΣΔ/n``; short outputs and long prompts make the tail. A fixed-seed Monte Carlo
        over ``TAIL_DRAWS`` requests."""
        s = self.shape
        if arrivals >= 1.0 or not s.output_strata or not s.prompt_strata:
            return self.mean_step_s(decodes, arrivals)
        import numpy as np

        t0 = self.step_s(decodes, 0)
        room = max(self.budget - decodes, 2)
        deltas = np.array([self.step_s(decodes, int(min(p, room))) - t0
                           for p in s.prompt_strata])
        rng = np.random.default_rng(0)
        n = np.array(s.output_strata)[rng.integers(0, len(s.output_strata), TAIL_DRAWS)] - 1.0
        n = n[n >= 1.0]
        k = rng.poisson(arrivals * n)
        picks = deltas[rng.integers(0, len(deltas), int(k.sum()))]
        owner = np.repeat(np.arange(len(n)), k)
        extra = np.bincount(owner, weights=picks, minlength=len(n))
        return float(np.quantile(t0 + extra / n, quantile))

    def at_rate(self, rate: float) -> tuple[float, float, str]:
        """(step time, decodes, what overflows or "") at ``rate`` req/s on this engine."""
        s = self.shape
        t = self.step_s(1, 0)
        decodes = 1.0
        for _ in range(40):
            decodes = max(rate * s.mean_output * t, 1.0)
            prefill = rate * s.mean_input * t
            if decodes > self.max_seqs:
                return t, decodes, "max_num_seqs"
            if decodes * (s.mean_input + s.mean_output / 2) > self.kv_tokens:
                return t, decodes, "kv"
            if decodes + prefill > self.budget:
                return t, decodes, "budget"
            nxt = self.mean_step_s(round(decodes), rate * t)
            if abs(nxt - t) <= 1e-3 * t:
                t = nxt
                break
            t = nxt
        return t, decodes, ""


def queue_wait_s(service_s: float, rate: float, quantile: float) -> float:
    """The ``quantile`` of a prompt's wait behind others for the prefill at ``rate`` with
    per-prompt service ``service_s`` (module docstring); infinite at saturation."""
    rho = rate * service_s
    if rho >= 1.0:
        return math.inf
    tail = 1.0 - quantile
    if rho <= tail:
        return 0.0
    return service_s * math.log(rho / tail) / (2.0 * (1.0 - rho))


def estimate(model: CostModel, engine: EngineConfig, shape: WorkloadShape,
             slos_ms: dict[str, float], num_engines: int, num_gpus: int,
             quantile: float = 0.99) -> Estimate:
    """The layout's estimate (module docstring); rates for all ``num_engines`` engines."""
    steady = _Steady(model, engine, shape)
    tpot_slo = slos_ms.get("tpot", slos_ms.get("itl", math.inf)) / 1e3
    ttft_slo = slos_ms.get("ttft", math.inf) / 1e3
    light_tpot = steady.step_s(1, 0)
    light_ttft = steady.prefill_s(0)

    def meets(rate: float) -> tuple[bool, float, str]:
        t, decodes, overflow = steady.at_rate(rate)
        if overflow:
            return False, t, overflow
        if t > tpot_slo or steady.tpot_tail_s(round(decodes), rate * t, quantile) > tpot_slo:
            return False, t, "tpot"
        room = max(steady.budget - decodes, 1.0)
        own = steady.prefill_s(int(decodes))
        wait = queue_wait_s(shape.mean_input * t / room, rate, quantile)
        if own + wait > ttft_slo:
            return False, t, "ttft"
        return True, t, ""

    lo, hi, limit = 0.0, 1.0, "slo"
    while hi < 1e6:  # bracket: double while the SLOs hold
        ok, _, why = meets(hi)
        if not ok:
            limit = why
            break
        lo, hi = hi, 2 * hi
    for _ in range(40):  # bisect to 0.1%
        if hi - lo <= 1e-3 * hi:
            break
        mid = (lo + hi) / 2
        ok, _, why = meets(mid)
        if ok:
            lo = mid
        else:
            hi, limit = mid, why
    capacity = lo * num_engines
    return Estimate(
        capacity_rps=capacity, light_tpot_s=light_tpot, light_ttft_s=light_ttft,
        tokens_per_s_per_gpu=capacity * shape.mean_output / num_gpus,
        tokens_per_s_per_user=1.0 / light_tpot if light_tpot > 0 else math.inf,
        limit=limit or "slo",
    )


def slo_unreachable(est: Estimate, slos_ms: dict[str, float]) -> str | None:
    """Why a lone request already misses an SLO by the margin (None when it does not)."""
    tpot = slos_ms.get("tpot", slos_ms.get("itl"))
    if tpot is not None and est.light_tpot_s * 1e3 > PRUNE_MARGIN * tpot:
        return (f"a lone request's decode step is {est.light_tpot_s * 1e3:.1f} ms "
                f"(TPOT SLO {tpot:g} ms)")
    ttft = slos_ms.get("ttft")
    if ttft is not None and est.light_ttft_s * 1e3 > PRUNE_MARGIN * ttft:
        return (f"a lone long prompt prefills in {est.light_ttft_s * 1e3:.0f} ms "
                f"(TTFT SLO {ttft:g} ms)")
    return None


def dominated(estimates: Sequence[Estimate]) -> list[int | None]:
    """For each estimate, the index of one that beats it by the margin on both throughput per
    GPU and tokens/s per user (None when none does)."""
    out: list[int | None] = []
    for e in estimates:
        by = None
        for j, o in enumerate(estimates):
            if (o.tokens_per_s_per_gpu >= PRUNE_MARGIN * e.tokens_per_s_per_gpu
                    and o.tokens_per_s_per_user >= PRUNE_MARGIN * e.tokens_per_s_per_user
                    and o.capacity_rps > 0):
                by = j
                break
        out.append(by)
    return out


def estimate_config(cfg_dict: dict[str, Any], slos_ms: dict[str, float], shape: WorkloadShape,
                    factory: Callable[[Any], CostModel] | None = None,
                    attainment: float = 0.99) -> Estimate:
    """The estimate of a full SimConfig dict (raises ``UserError`` when it cannot run)."""
    from sim.config import SimConfig, resolve_engine_config
    from sim.runtime import make_cost_model

    cfg = SimConfig.from_dict(dict(cfg_dict))
    engine = resolve_engine_config(cfg)
    model = factory(cfg) if factory is not None else make_cost_model(cfg, engine)
    if not hasattr(model, "step_time"):
        raise UserError("the cost model cannot price steps")
    engines = cfg.data_parallel_size
    gpus = cfg.tensor_parallel_size * engines * getattr(cfg, "pipeline_parallel_size", 1)
    return estimate(model, engine, shape, slos_ms, engines, gpus, attainment)
