"""Fitted cost model: step time from a profile of the real engine (docs/validation.md, "The
fitted model").

Responsibility: turn a profile CSV (``engine/worker/profiler.py``'s ``PROFILE_COLUMNS``) into a
``CostModel`` with the roofline's physically meaningful features and non-negative coefficients,
report its own error on held-out rows, and round-trip through a small JSON file.

Features of a step (``FEATURES``; per step, all layers, units in the names):

* ``step`` — 1: per-step constant (launch, input preparation, sampler set-up; on a GPU also the
  weight read of a memory-bound step, which for one model is a per-step constant too);
* ``per_request`` — scheduled requests (per-sequence work: metadata, the CPU attention loop);
* ``linear_flops`` — ``2 · max(T, knee) · params_linear``: QKV/O/MLP GEMMs over ``T`` tokens.
  Below ``knee`` tokens the GEMMs are weight-read bound (time flat in ``T``), above it compute
  bound; ``knee`` (the roofline's crossover) is chosen by the fit, 0 when the data shows none;
* ``lm_head_flops`` — ``2 · rows · hidden · vocab`` for the rows that sample;
* ``prefill_attention_flops`` — ``Σ 4 · H · d · L · q · (ctx + (q+1)/2)`` over prefill chunks;
* ``decode_kv_bytes`` — ``Σ ctx · 2 · K · d · c · L``: KV the decodes read.

Coefficients minimise the *relative* squared error (rows weighted by 1 / measured time) under
``coef >= 0`` (Lawson–Hanson NNLS, ``nnls``). Step rows come from two sources, weighted equally
in total: the profiler's grid (``step``: back-to-back replays, many samples each) and the steps
of real calibration runs (``in_loop``: one sample each, caches shared with the engine loop);
within a source each (kind, batch size) group weighs the same (``_source_weights``). A
seeded fraction of the rows is held out and the saved model is the one fitted without them, so
the reported held-out error is the saved model's.

The JSON also carries the front-end and engine-loop CPU costs measured with the profile
(``FrontendCosts``) and how they map onto the simulator's ``FrontendConfig``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import ConfigError, is_number
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.cost.nnls import fit_nonnegative

FORMAT = "twinserve-fitted-cost-model/1"
FEATURES: tuple[tuple[str, str], ...] = (
    ("step", "1/step"),
    ("per_request", "requests"),
    ("linear_flops", "FLOP"),
    ("lm_head_flops", "FLOP"),
    ("prefill_attention_flops", "FLOP"),
    ("decode_kv_bytes", "byte"),
)
FEATURE_NAMES: tuple[str, ...] = tuple(n for n, _ in FEATURES)
STEP_KINDS: tuple[str, ...] = ("prefill", "decode", "mixed")


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """The model shape the features need (the profiled checkpoint's config)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int  # weights and KV cache

    @property
    def linear_params(self) -> int:
        """QKV, O, gate+up and down weights of all layers (no embedding, no LM head)."""
        h, d = self.hidden_size, self.head_dim
        per_layer = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        return self.num_layers * (per_layer + 3 * h * self.intermediate_size)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_qk(self) -> float:
        """FLOPs of one query attending one key, all layers (QK^T and PV)."""
        return 4.0 * self.num_heads * self.head_dim * self.num_layers


# -- the profile ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProfileRecord:
    """One row of a profile CSV (see ``engine.worker.profiler.PROFILE_COLUMNS``)."""

    kind: str
    name: str
    shape: BatchShape | None  # step rows only
    size: int
    size2: int
    median_s: float
    mean_s: float
    p10_s: float
    p90_s: float
    num_samples: int
    cpu_ratio: float

    def value(self, statistic: str) -> float:
        """The row's ``mean_s`` or ``median_s``."""
        return self.mean_s if statistic == "mean" else self.median_s


STATISTICS = ("mean", "median")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(";") if v != "")


def read_profile_csv(path: str | Path) -> list[ProfileRecord]:
    """All rows of a profile CSV; raises ``ConfigError`` naming a missing column."""
    p = Path(path)
    try:
        with p.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ConfigError(f"cannot read profile {p}: {exc.strerror}") from None
    out = []
    for i, r in enumerate(rows):
        try:
            shape = None
            if r["kind"] in STEP_KINDS:
                shape = BatchShape(
                    int(r["num_reqs"]), int(r["num_tokens"]), _ints(r["prefill_query_lens"]),
                    _ints(r["prefill_context_lens"]), int(r["num_decode_reqs"]),
                    int(r["decode_context_sum"]), int(r["decode_context_max"]),
                    int(r["num_sampling_reqs"]),
                )
            out.append(ProfileRecord(
                r["kind"], r["name"], shape, int(r["size"]), int(r.get("size2") or 0),
                float(r["median_s"]), float(r.get("mean_s") or r["median_s"]),
                float(r["p10_s"]), float(r["p90_s"]), int(r["num_samples"]),
                float(r["cpu_ratio"]),
            ))
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{p}: row {i + 2} is not a profile row ({exc})") from None
    return out


# -- front-end and engine-loop costs -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StageCost:
    """``intercept_s + slope_s · units + slope2_s · units2`` of one CPU stage (NNLS fit)."""

    intercept_s: float
    slope_s: float  # seconds per unit
    slope2_s: float  # seconds per unit of the second count
    unit: str  # what ``size`` counts
    unit2: str  # what ``size2`` counts ("" if unused)
    num_rows: int  # profile rows it was fitted to (0 = not measured: zero cost)

    def __call__(self, units: float, units2: float = 0.0) -> float:
        return self.intercept_s + self.slope_s * units + self.slope2_s * units2


#: Stage name → (unit of ``size``, unit of ``size2``). ``loop/*`` come from a real run of the
#: engine loop, ``frontend/*`` from timing the front-end callables alone.
STAGES: dict[str, tuple[str, str]] = {
    # begin_step → execute start
    "loop/schedule": ("scheduled requests", "new requests"),
    # execute end → outputs delivered (update_from_output + output processing)
    "loop/post": ("output tokens", "finished requests"),
    # delivered → next begin_step (loop top, admitting arrivals)
    "loop/gap": ("arrivals", ""),
    # one request: validate, build, register with the output processor and the core
    "frontend/admit": ("prompt tokens", ""),
    "frontend/tokenize": ("prompt tokens", ""),
    "frontend/detokenize": ("output tokens", ""),
}


@dataclass(frozen=True, slots=True)
class IdleWakeup:
    """Extra time of the first step after the engine loop slept ``idle_s`` seconds:
    ``extra_s · min(1, idle_s / ramp_s)`` (``ramp_s`` 0: any idle period pays all of it) —
    the simulator's ``FrontendConfig.idle_wakeup_s`` / ``idle_wakeup_ramp_s``.

    Fitted from the profile's ``("loop", "wakeup")`` rows: size 0 = the step back to back,
    size d = the same step after d µs asleep. ``extra_s`` is the median excess of the idle
    durations of at least ``SATURATED_IDLE_S`` (the longest one if none is that long);
    ``ramp_s`` is the measured idle duration whose ramp fits the excesses best (least
    squares; 0 among the candidates)."""

    extra_s: float = 0.0
    ramp_s: float = 0.0
    num_rows: int = 0  # 0: not measured (no cost)

    SATURATED_IDLE_S = 0.02

    @staticmethod
    def fit(records: Sequence[ProfileRecord], statistic: str = "mean") -> IdleWakeup:
        rows = {r.size: r.value(statistic) for r in records
                if r.kind == "loop" and r.name == "wakeup"}
        if 0 not in rows or len(rows) < 2:
            return IdleWakeup()
        base = rows.pop(0)
        idle = np.array(sorted(rows), dtype=np.float64) * 1e-6
        excess = np.maximum(np.array([rows[k] for k in sorted(rows)]) - base, 0.0)
        saturated = excess[idle >= IdleWakeup.SATURATED_IDLE_S]
        extra = float(np.median(saturated)) if len(saturated) else float(excess[-1])
        best = (math.inf, 0.0)
        for ramp in (0.0, *idle.tolist()):
            model = extra * (np.minimum(idle / ramp, 1.0) if ramp > 0 else np.ones_like(idle))
            loss = float(np.sum((model - excess) ** 2))
            if loss < best[0] - 1e-18:
                best = (loss, ramp)
        return IdleWakeup(extra, best[1], len(rows) + 1)


@dataclass(frozen=True, slots=True)
class FrontendCosts:
    """CPU costs around the model step, measured with the profile (zero where unmeasured),
    and the wake-up cost of the first step after the loop idled."""

    stages: dict[str, StageCost] = field(default_factory=dict)
    wakeup: IdleWakeup = IdleWakeup()

    def get(self, name: str) -> StageCost:
        unit, unit2 = STAGES.get(name, ("", ""))
        return self.stages.get(name) or StageCost(0.0, 0.0, 0.0, unit, unit2, 0)

    @staticmethod
    def fit(records: Sequence[ProfileRecord], statistic: str = "mean") -> FrontendCosts:
        stages = {}
        for name, (unit, unit2) in STAGES.items():
            kind, stage = name.split("/")
            rows = [r for r in records if r.kind == kind and r.name == stage]
            if not rows:
                continue
            x = np.array([[1.0, r.size, r.size2] for r in rows])
            y = np.array([r.value(statistic) for r in rows])
            # relative errors (as the step model), rows of many samples count more
            w = np.sqrt(np.array([max(r.num_samples, 1) for r in rows], dtype=np.float64))
            w = w / np.maximum(y, 1e-9)
            c = fit_nonnegative(x, y, w) if len(rows) > 1 else np.array([y[0], 0.0, 0.0])
            stages[name] = StageCost(float(c[0]), float(c[1]), float(c[2]), unit, unit2,
                                     len(rows))
        return FrontendCosts(stages, IdleWakeup.fit(records, statistic))

    def frontend_config_values(self, mode: str = "in_process",
                               mean_output_len: float = 32.0) -> dict[str, float | int]:
        """``sim.config.FrontendConfig`` fields that reproduce the measured path.

        ``in_process`` (``twinserve run-real``): one thread runs the whole loop, so output
        processing blocks the engine, while the simulator's output processor is a separate
        stage. The per-step part of the post-step CPU therefore goes to both
        ``output_batch_overhead_s`` (when outputs reach the client) and ``update_overhead_s``
        (when the loop resumes); its per-token part, and the once-per-request costs of
        admitting (schedule) and finishing (post) a request spread over the request's
        ``mean_output_len`` steps, go to ``schedule_s_per_request`` (a step's output tokens ≈
        its requests). Deliveries and the loop period then match the serial loop; only the
        engine-side token time moves by the per-token cost. Prompts are token ids: the
        admission cost (per arrival, as measured inside the loop) stands in for the front end;
        it delays the request as in the real loop but, unlike there, does not block the engine.

        ``stages``: a server whose API-server and output processes run beside the engine.

        Both carry the measured wake-up cost (``idle_wakeup_s``, ``idle_wakeup_ramp_s``).
        """
        sched, post, gap = self.get("loop/schedule"), self.get("loop/post"), self.get("loop/gap")
        admit = self.get("frontend/admit")
        per_request_once = (sched.slope2_s + post.slope2_s) / max(mean_output_len, 1.0)
        wake = {"idle_wakeup_s": self.wakeup.extra_s, "idle_wakeup_ramp_s": self.wakeup.ramp_s}
        if mode == "in_process":
            # an arrival's admission as measured inside the loop (gap slope) when there is one
            admit_s = gap.slope_s if gap.num_rows > 1 and gap.slope_s > 0 else admit.intercept_s
            return {
                **wake,
                "num_api_servers": 1,
                "request_overhead_s": admit_s,
                "tokenize_s_per_token": admit.slope_s,
                "ipc_latency_s": 0.0,
                "detokenize_s_per_token": 0.0,
                "output_batch_overhead_s": post.intercept_s,
                "network_latency_s": 0.0,
                "schedule_overhead_s": sched.intercept_s,
                "schedule_s_per_request": sched.slope_s + post.slope_s + per_request_once,
                "update_overhead_s": post.intercept_s + gap.intercept_s,
            }
        if mode == "stages":
            tok, detok = self.get("frontend/tokenize"), self.get("frontend/detokenize")
            return {
                **wake,
                "request_overhead_s": admit.intercept_s + tok.intercept_s,
                "tokenize_s_per_token": tok.slope_s + admit.slope_s,
                "detokenize_s_per_token": detok.slope_s,
                "output_batch_overhead_s": post.intercept_s,
                "schedule_overhead_s": sched.intercept_s,
                "schedule_s_per_request": sched.slope_s + per_request_once,
                "update_overhead_s": gap.intercept_s,
            }
        raise ConfigError(f"unknown front-end mapping {mode!r}: use in_process or stages")

    def to_json(self) -> dict[str, Any]:
        values: dict[str, Any] = {name: asdict(c) for name, c in self.stages.items()}
        values["idle_wakeup"] = asdict(self.wakeup)
        return values

    @staticmethod
    def from_json(values: dict[str, Any]) -> FrontendCosts:
        stages = {k: StageCost(**v) for k, v in values.items() if k != "idle_wakeup"}
        return FrontendCosts(stages, IdleWakeup(**values.get("idle_wakeup", {})))


def _source_weights(rows: Sequence[ProfileRecord],
                    shares: Mapping[str, float] | None = None) -> np.ndarray:
    """Row weights of the squared loss: each source of step rows (``name``: the grid's
    ``step`` replays, the ``in_loop`` steps of real runs) carries the same total weight (or
    its part of ``shares``, normalised over the sources present), and within a source each
    (kind, scheduled requests) group weighs the same — a calibration run at concurrency 1
    yields hundreds of identical one-request steps, which must not outvote the rest of the
    profile."""
    groups: dict[tuple[str, str, int], int] = {}
    sources: dict[str, set[tuple[str, str, int]]] = {}
    for r in rows:
        key = (r.name, r.kind, r.shape.num_reqs if r.shape is not None else 0)
        groups[key] = groups.get(key, 0) + 1
        sources.setdefault(r.name, set()).add(key)
    given = {name: float((shares or {}).get(name, 1.0)) for name in sources}
    total = sum(given.values()) or 1.0
    weights = []
    for r in rows:
        key = (r.name, r.kind, r.shape.num_reqs if r.shape is not None else 0)
        share = given[r.name] / (total * len(sources[r.name]) * groups[key])
        weights.append(math.sqrt(share * len(rows)))
    return np.array(weights)


# -- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FitError:
    """Absolute relative errors of a set of rows."""

    num_rows: int
    median_abs_rel_err: float
    p90_abs_rel_err: float
    max_abs_rel_err: float

    @staticmethod
    def of(predicted: np.ndarray, measured: np.ndarray) -> FitError:
        if len(measured) == 0:
            return FitError(0, math.nan, math.nan, math.nan)
        err = np.abs(predicted - measured) / measured
        return FitError(len(err), float(np.median(err)), float(np.percentile(err, 90)),
                        float(err.max()))


class FittedCostModel:
    """``CostModel`` with coefficients fitted to a profile (see the module docstring)."""

    def __init__(
        self,
        geometry: ModelGeometry,
        coefficients: dict[str, float],
        linear_knee_tokens: int = 0,
        *,
        frontend: FrontendCosts | None = None,
        fit_report: dict[str, Any] | None = None,
        measured_on: dict[str, Any] | None = None,
    ) -> None:
        missing = set(FEATURE_NAMES) - set(coefficients)
        if missing:
            raise ConfigError(f"fitted model lacks coefficients for {', '.join(sorted(missing))}")
        bad = {
            n: c for n, c in coefficients.items()
            if not (is_number(c) and 0 <= c < math.inf)
        }
        if bad:
            raise ConfigError(f"fitted coefficients must be finite numbers >= 0, got {bad}")
        self.geometry = geometry
        self.coefficients = {n: float(coefficients[n]) for n in FEATURE_NAMES}
        self.linear_knee_tokens = int(linear_knee_tokens)
        self.frontend = frontend or FrontendCosts()
        self.fit_report = fit_report or {}
        self.measured_on = measured_on or {}
        c = self.coefficients
        self._c = tuple(c[n] for n in FEATURE_NAMES)
        g = geometry
        self._linear_flops_per_token = 2.0 * g.linear_params
        self._lm_head_flops_per_row = 2.0 * g.hidden_size * g.vocab_size
        self._attn_flops = g.attention_flops_per_qk
        self._kv_bytes = float(g.kv_bytes_per_token)

    # -- features -------------------------------------------------------------------------------
    def prefill_attention_flops(self, shape: BatchShape) -> float:
        flops = 0.0
        for q, ctx in zip(shape.prefill_query_lens, shape.prefill_context_lens, strict=True):
            flops += q * (ctx + (q + 1) / 2.0)
        return self._attn_flops * flops

    def features(self, shape: BatchShape) -> np.ndarray:
        """The feature vector of a step, in ``FEATURE_NAMES`` order."""
        return np.array(self._features(shape.num_reqs, shape.num_tokens, shape.num_sampling_reqs,
                                       self.prefill_attention_flops(shape),
                                       shape.decode_context_sum))

    def _features(self, num_reqs: int, num_tokens: int, num_sampling: int,
                  prefill_attn_flops: float, decode_ctx_sum: int) -> tuple[float, ...]:
        knee = self.linear_knee_tokens
        return (
            1.0,
            float(num_reqs),
            self._linear_flops_per_token * (num_tokens if num_tokens > knee else knee),
            self._lm_head_flops_per_row * num_sampling,
            prefill_attn_flops,
            self._kv_bytes * decode_ctx_sum,
        )

    def _terms(self, num_reqs: int, num_tokens: int, num_sampling: int,
               prefill_attn_flops: float, decode_ctx_sum: int) -> tuple[float, float, float]:
        """(linear, attention, overhead) seconds; the one arithmetic path of every total."""
        f = self._features(num_reqs, num_tokens, num_sampling, prefill_attn_flops,
                           decode_ctx_sum)
        c = self._c
        overhead = c[0] * f[0] + c[1] * f[1]
        linear = c[2] * f[2] + c[3] * f[3]
        attention = c[4] * f[4] + c[5] * f[5]
        return linear, attention, overhead

    # -- the protocol ---------------------------------------------------------------------------
    def step_time(self, shape: BatchShape) -> StepTime:
        if shape.num_tokens == 0:
            return StepTime(total_s=0.0)
        linear, attention, overhead = self._terms(
            shape.num_reqs, shape.num_tokens, shape.num_sampling_reqs,
            self.prefill_attention_flops(shape), shape.decode_context_sum,
        )
        return StepTime(total_s=linear + attention + overhead, linear_s=linear,
                        attention_s=attention, overhead_s=overhead)

    def time_of(self, num_reqs: int, num_tokens: int, num_sampling: int,
                prefill_attention_flops: float, decode_context_sum: int) -> float:
        """The step time of a step given by its feature inputs directly (also fractional
        "average" steps, e.g. for capacity estimates)."""
        linear, attention, overhead = self._terms(num_reqs, num_tokens, num_sampling,
                                                  prefill_attention_flops, decode_context_sum)
        return linear + attention + overhead

    def attention_flops(self, query_len: float, context_len: float) -> float:
        """``prefill_attention_flops`` of one chunk."""
        return self._attn_flops * query_len * (context_len + (query_len + 1) / 2.0)

    def decode_step_total(self, num_reqs: int, context_sum: int, context_max: int) -> float:
        """``step_time(...).total_s`` of a pure-decode step, bit for bit (same arithmetic;
        the fitted features do not use the longest context, ``context_max``)."""
        linear, attention, overhead = self._terms(num_reqs, num_reqs, num_reqs, 0.0, context_sum)
        return linear + attention + overhead

    def decode_step_host(self, num_reqs: int) -> tuple[float, float]:
        """A fitted step folds its host work into its measured duration: (0, 0)."""
        return 0.0, 0.0

    def scaled(self, factor: float) -> FittedCostModel:
        """This model on a machine ``factor`` times slower: every step coefficient, every CPU
        stage cost and the idle wake-up cost multiplied, the wake-up ramp (an idle duration)
        kept — how ``twinserve validate`` separates a change of the machine's speed, seen by
        its speed probe, from the model's own error."""
        if not factor > 0:
            raise ConfigError(f"scale factor must be > 0, got {factor}")
        stages = {
            name: replace(c, intercept_s=c.intercept_s * factor, slope_s=c.slope_s * factor,
                          slope2_s=c.slope2_s * factor)
            for name, c in self.frontend.stages.items()
        }
        wakeup = replace(self.frontend.wakeup, extra_s=self.frontend.wakeup.extra_s * factor)
        return FittedCostModel(
            self.geometry, {k: v * factor for k, v in self.coefficients.items()},
            self.linear_knee_tokens, frontend=replace(self.frontend, stages=stages, wakeup=wakeup),
            fit_report=self.fit_report, measured_on={**self.measured_on, "scaled_by": factor},
        )

    # -- fitting --------------------------------------------------------------------------------
    @staticmethod
    def fit(
        records: Sequence[ProfileRecord],
        geometry: ModelGeometry,
        *,
        holdout_fraction: float = 0.2,
        seed: int = 0,
        knee_candidates: Sequence[int] | None = None,
        measured_on: dict[str, Any] | None = None,
        statistic: str = "mean",
        source_shares: Mapping[str, float] | None = None,
    ) -> FittedCostModel:
        """Fit step rows of ``records`` (front-end rows go to ``FrontendCosts``).

        ``statistic`` picks each row's target: ``mean`` (default: a run's latencies add step
        times up, so under intermittent load from other processes the expected step time is
        what matters) or ``median``. ``source_shares`` weighs the sources of step rows
        (default: equally; e.g. ``{"in_loop": 3, "step": 1}``).
        """
        if not 0.0 <= holdout_fraction < 1.0:
            raise ConfigError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
        if statistic not in STATISTICS:
            raise ConfigError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
        steps = [r for r in records if r.shape is not None and r.value(statistic) > 0]
        if len(steps) < len(FEATURE_NAMES):
            raise ConfigError(
                f"a fit needs at least {len(FEATURE_NAMES)} step rows, the profile has "
                f"{len(steps)}"
            )
        order = np.random.default_rng(seed).permutation(len(steps))
        num_hold = round(holdout_fraction * len(steps))
        if len(steps) - num_hold < len(FEATURE_NAMES):
            num_hold = 0
        hold = {int(i) for i in order[:num_hold]}
        train = [r for i, r in enumerate(steps) if i not in hold]
        held = [r for i, r in enumerate(steps) if i in hold]
        tokens = sorted({r.shape.num_tokens for r in train if r.shape is not None})
        candidates = sorted({0, *(knee_candidates if knee_candidates is not None else tokens)})
        best: tuple[float, FittedCostModel] | None = None
        for knee in candidates:
            model = FittedCostModel._fit_at(train, geometry, knee, statistic, source_shares)
            pred, meas = model._predict(train, statistic)
            loss = float(np.sum(((pred - meas) / meas) ** 2))
            if best is None or loss < best[0] - 1e-12:
                best = (loss, model)
        assert best is not None
        model = best[1]
        report: dict[str, Any] = {
            "weighting": "relative (rows weighted by 1 / measured time)",
            "statistic": statistic, "holdout_fraction": holdout_fraction, "seed": seed,
            "source_shares": dict(source_shares) if source_shares else "equal",
            "train": asdict(FitError.of(*model._predict(train, statistic))),
            "holdout": asdict(FitError.of(*model._predict(held, statistic))),
            "holdout_by_source": {
                name: asdict(FitError.of(*model._predict(
                    [r for r in held if r.name == name], statistic)))
                for name in sorted({r.name for r in steps})
            },
            "holdout_by_kind": {
                kind: asdict(FitError.of(*model._predict(
                    [r for r in held if r.kind == kind], statistic)))
                for kind in STEP_KINDS
            },
            "num_step_rows": len(steps),
        }
        return FittedCostModel(geometry, model.coefficients, model.linear_knee_tokens,
                               frontend=FrontendCosts.fit(records, statistic),
                               fit_report=report,
                               measured_on=measured_on)

    @staticmethod
    def _fit_at(rows: Sequence[ProfileRecord], geometry: ModelGeometry, knee: int,
                statistic: str,
                source_shares: Mapping[str, float] | None = None) -> FittedCostModel:
        probe = FittedCostModel(geometry, dict.fromkeys(FEATURE_NAMES, 0.0), knee)
        x = np.array([probe.features(r.shape) for r in rows if r.shape is not None])
        y = np.array([r.value(statistic) for r in rows])
        coef = fit_nonnegative(x, y, _source_weights(rows, source_shares) / y)
        return FittedCostModel(geometry, dict(zip(FEATURE_NAMES, coef.tolist(), strict=True)),
                               knee)

    def _predict(self, rows: Sequence[ProfileRecord],
                 statistic: str) -> tuple[np.ndarray, np.ndarray]:
        pred = np.array([self.step_time(r.shape).total_s for r in rows if r.shape is not None])
        return pred, np.array([r.value(statistic) for r in rows if r.shape is not None])

    # -- JSON -----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "features": [
                {"name": n, "unit": u, "coefficient": self.coefficients[n],
                 "coefficient_unit": f"s/{u}"}
                for n, u in FEATURES
            ],
            "linear_knee_tokens": self.linear_knee_tokens,
            "weight_read_s": self.coefficients["linear_flops"] * self._linear_flops_per_token
            * self.linear_knee_tokens,
            "geometry": asdict(self.geometry),
            "fit": self.fit_report,
            "measured_on": self.measured_on,
            "frontend": self.frontend.to_json(),
            "frontend_config": {m: self.frontend.frontend_config_values(m)
                                for m in ("in_process", "stages")},
        }

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return p

    @staticmethod
    def from_json(values: dict[str, Any]) -> FittedCostModel:
        if values.get("format") != FORMAT:
            raise ConfigError(f"not a fitted cost model (format {values.get('format')!r}, "
                              f"expected {FORMAT!r})")
        return FittedCostModel(
            ModelGeometry(**values["geometry"]),
            {f["name"]: f["coefficient"] for f in values["features"]},
            values.get("linear_knee_tokens", 0),
            frontend=FrontendCosts.from_json(values.get("frontend") or {}),
            fit_report=values.get("fit"),
            measured_on=values.get("measured_on"),
        )

    @staticmethod
    def load(path: str | Path) -> FittedCostModel:
        p = Path(path)
        try:
            values = json.loads(p.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read fitted cost model {p}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p} is not valid JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{p}: a fitted cost model is a JSON object, got {values!r:.60}")
        _require_finite(values.get("frontend"), f"{p}: frontend")
        try:
            return FittedCostModel.from_json(values)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ConfigError):
                raise ConfigError(f"{p}: {exc}") from None
            raise ConfigError(
                f"{p} is not a valid fitted cost model ({type(exc).__name__}: {exc}); "
                "write one with `twinserve profile`"
            ) from None


def _require_finite(value: object, where: str) -> None:
    """Every number in a nested JSON value is finite (a NaN or infinite cost never ends a
    simulated step)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _require_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _require_finite(v, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value}")
