"""Profiling the real worker: step times over a grid of batch shapes, and per-unit CPU costs.

Responsibility: produce the measured rows a fitted cost model is fitted to
(docs/validation.md, "The fitted model").

* ``StepProfiler`` runs hand-made ``SchedulerOutput``s through a ``TorchExecutor``: prefill
  chunks ``(query_len, context_len)``, decode batches ``(num_reqs, context_len)`` and mixed
  steps (decodes plus one prefill chunk). Each shape's requests are registered once (a new-request
  step, untimed), then the *same* cached-request step is replayed — the worker takes
  ``num_computed_tokens`` from the schedule, so every replay computes exactly the shape asked
  for. Shapes are measured in ``rounds`` passes (shuffled with the seed), so a slow drift in the
  machine's load spreads over all shapes instead of biasing a few; each row keeps the median and
  the spread of its samples.
* ``StepProfiler.measure_wakeup`` times one small prefill right after the thread slept for a
  few idle durations, and right after another step: what an engine loop that slept until the
  next arrival pays on its first step (cold caches, lowered clocks).
* ``time_unit_costs`` times any callable of one size argument (tokenize ``n`` prompt tokens,
  detokenize ``n`` tokens, admit one request of ``n`` prompt tokens …) — the callables are
  injected by the caller, so this module needs nothing of the front end (import direction:
  ``engine.worker`` imports only ``engine.core`` and ``kernels``).

Every sample also records the thread's CPU time: on a CPU device ``cpu_ratio`` = CPU time /
wall time tells whether the measuring thread had its core (1.0) or shared it with other
processes (< 1), which is how a noisy profile shows itself.

The CSV (``PROFILE_COLUMNS``, one row per shape or per size) is the contract with
``sim.cost.fitted``; it is plain text a user can ship with a report.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.core.outputs import (
    AdmissionBlocker,
    BatchShape,
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from engine.core.request import SamplingParams
from engine.worker.executor import TorchExecutor

#: Columns of a profile CSV, in order (``sim.cost.fitted`` reads them by name).
PROFILE_COLUMNS: tuple[str, ...] = (
    "kind",  # prefill | decode | mixed (step rows); frontend | loop (unit-cost rows)
    "name",  # "step" for step rows; the measured stage for unit-cost rows
    "num_reqs",
    "num_tokens",
    "prefill_query_lens",  # ";"-separated
    "prefill_context_lens",  # ";"-separated
    "num_decode_reqs",
    "decode_context_sum",
    "decode_context_max",
    "num_sampling_reqs",
    "size",  # the unit count of a unit-cost row (tokens, requests); num_tokens for steps
    "size2",  # a unit-cost row's second count (e.g. new requests of a schedule); 0 if none
    "median_s",
    "mean_s",  # what the fitted model predicts by default: latencies add step times up
    "p10_s",
    "p90_s",
    "min_s",
    "max_s",
    "num_samples",
    "cpu_ratio",  # median thread CPU time / wall time of the samples (NaN if unknown)
)

STEP_KINDS: tuple[str, ...] = ("prefill", "decode", "mixed")

#: Token ids below this are left out of profiling prompts (special tokens live there).
FIRST_PLAIN_TOKEN = 16


@dataclass(frozen=True, slots=True)
class SampleStats:
    """Median, mean and spread of repeated timings (seconds)."""

    median_s: float
    mean_s: float
    p10_s: float
    p90_s: float
    min_s: float
    max_s: float
    num_samples: int
    cpu_ratio: float  # median CPU/wall over the samples; NaN when not measured

    @staticmethod
    def of(wall_s: Sequence[float], cpu_s: Sequence[float] | None = None) -> SampleStats:
        if not wall_s:
            raise ValueError("no samples")
        arr = np.asarray(wall_s, dtype=np.float64)
        p10, p50, p90 = np.percentile(arr, [10, 50, 90])
        ratio = float("nan")
        if cpu_s is not None:
            ratios = [c / w for c, w in zip(cpu_s, wall_s, strict=True) if w > 0]
            ratio = statistics.median(ratios) if ratios else float("nan")
        return SampleStats(float(p50), float(arr.mean()), float(p10), float(p90),
                           float(arr.min()), float(arr.max()), len(arr), ratio)


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One measured row: a step shape, or one size of a per-unit cost."""

    kind: str  # see PROFILE_COLUMNS
    name: str  # "step" or the unit-cost stage
    shape: BatchShape | None  # the step's shape (step rows only)
    size: int  # units of a unit-cost row; num_tokens of a step row
    stats: SampleStats
    size2: int = 0  # a unit-cost row's second count (0 for step rows)

    def to_csv_dict(self) -> dict[str, object]:
        s = self.shape or BatchShape.empty()
        st = self.stats
        return {
            "kind": self.kind, "name": self.name, "num_reqs": s.num_reqs,
            "num_tokens": s.num_tokens,
            "prefill_query_lens": ";".join(map(str, s.prefill_query_lens)),
            "prefill_context_lens": ";".join(map(str, s.prefill_context_lens)),
            "num_decode_reqs": s.num_decode_reqs, "decode_context_sum": s.decode_context_sum,
            "decode_context_max": s.decode_context_max,
            "num_sampling_reqs": s.num_sampling_reqs, "size": self.size, "size2": self.size2,
            "median_s": repr(st.median_s), "mean_s": repr(st.mean_s),
            "p10_s": repr(st.p10_s), "p90_s": repr(st.p90_s),
            "min_s": repr(st.min_s), "max_s": repr(st.max_s), "num_samples": st.num_samples,
            "cpu_ratio": repr(st.cpu_ratio),
        }


def write_profile_csv(path: str | Path, rows: Iterable[ProfileRow]) -> Path:
    """Write rows in ``PROFILE_COLUMNS`` order; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(PROFILE_COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow(row.to_csv_dict())
    return p


# -- the shape grid ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ShapeSpec:
    """A step to measure: prefill chunks and decodes (each decode has ``query_len`` 1)."""

    kind: str  # prefill | decode | mixed
    prefill_chunks: tuple[tuple[int, int], ...]  # (query_len, context_len)
    decode_context_lens: tuple[int, ...]  # context of each decode
    num_partial: int = 0  # the first num_partial chunks are non-final: they sample nothing

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ValueError(f"kind must be one of {STEP_KINDS}, got {self.kind!r}")
        if any(q < 2 or c < 0 for q, c in self.prefill_chunks):
            raise ValueError("prefill chunks need query_len >= 2 and context_len >= 0")
        if any(c < 1 for c in self.decode_context_lens):
            raise ValueError("decode context lengths must be >= 1")
        if not self.prefill_chunks and not self.decode_context_lens:
            raise ValueError("a shape needs at least one request")
        if not 0 <= self.num_partial <= len(self.prefill_chunks):
            raise ValueError("num_partial must be in [0, number of prefill chunks]")

    @property
    def num_reqs(self) -> int:
        return len(self.prefill_chunks) + len(self.decode_context_lens)

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _ in self.prefill_chunks) + len(self.decode_context_lens)

    def max_seq_len(self) -> int:
        """Longest sequence (context + query + the one sampled token)."""
        lens = [c + q + 1 for q, c in self.prefill_chunks] + [
            c + 2 for c in self.decode_context_lens
        ]
        return max(lens)

    def num_blocks(self, block_size: int) -> int:
        """KV blocks the shape's requests hold (each request its own blocks)."""
        seqs = [c + q + 1 for q, c in self.prefill_chunks] + [
            c + 2 for c in self.decode_context_lens
        ]
        return sum(-(-s // block_size) for s in seqs)

    def batch_shape(self) -> BatchShape:
        """The ``BatchShape`` the scheduler would report for this step (decodes first)."""
        dec = self.decode_context_lens
        return BatchShape(
            num_reqs=self.num_reqs,
            num_tokens=self.num_tokens,
            prefill_query_lens=tuple(q for q, _ in self.prefill_chunks),
            prefill_context_lens=tuple(c for _, c in self.prefill_chunks),
            num_decode_reqs=len(dec),
            decode_context_sum=sum(dec),
            decode_context_max=max(dec, default=0),
            num_sampling_reqs=self.num_reqs - self.num_partial,
        )


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """Which shapes to measure and how often.

    Prefill rows: ``prefill_batch_sizes`` chunks of ``q`` tokens on ``ctx`` cached tokens for
    every (q, ctx), and one non-final chunk (it samples nothing: separates the LM-head rows from
    the per-request cost) for each ``partial_query_lens``; decode rows: ``n`` decodes of context
    ``ctx``; mixed rows: ``n`` decodes of context ``mixed_context_len`` plus ``k`` fresh prompts
    of ``q`` tokens for each ``k`` in ``mixed_prefill_counts``. Shapes over
    ``max_num_batched_tokens`` / ``max_num_seqs`` / ``max_model_len`` are left out, as the
    scheduler would never build them.
    """

    prefill_query_lens: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    prefill_context_lens: tuple[int, ...] = (0, 512)
    prefill_batch_sizes: tuple[int, ...] = (1, 3)
    partial_query_lens: tuple[int, ...] = (64, 256)
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    decode_context_lens: tuple[int, ...] = (16, 128, 512)
    mixed_decode_batch_sizes: tuple[int, ...] = (1, 4, 16, 48)
    mixed_query_lens: tuple[int, ...] = (64, 256)
    mixed_prefill_counts: tuple[int, ...] = (1, 3)
    mixed_context_len: int = 128
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 8192
    warmup: int = 1  # untimed replays per shape and round
    repeats: int = 3  # timed replays per shape and round
    rounds: int = 3  # passes over the grid (samples per shape = repeats × rounds)
    seed: int = 0  # prompt tokens and the order of shapes within a round

    def __post_init__(self) -> None:
        for name in ("warmup",):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("repeats", "rounds", "max_num_batched_tokens", "max_num_seqs",
                     "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def shapes(self) -> list[ShapeSpec]:
        """The grid's shapes, in a fixed order (prefill, decode, mixed)."""
        out: list[ShapeSpec] = []
        for q in self.prefill_query_lens:
            for ctx in self.prefill_context_lens:
                for b in self.prefill_batch_sizes:
                    out.append(ShapeSpec("prefill", ((q, ctx),) * b, ()))
        for q in self.partial_query_lens:
            out.append(ShapeSpec("prefill", ((q, 0),), (), num_partial=1))
        for n in self.decode_batch_sizes:
            for ctx in self.decode_context_lens:
                out.append(ShapeSpec("decode", (), (ctx,) * n))
        for n in self.mixed_decode_batch_sizes:
            for q in self.mixed_query_lens:
                for k in self.mixed_prefill_counts:
                    out.append(ShapeSpec("mixed", ((q, 0),) * k, (self.mixed_context_len,) * n))
        return [s for s in dict.fromkeys(out) if self._fits(s)]

    def _fits(self, s: ShapeSpec) -> bool:
        return (s.num_tokens <= self.max_num_batched_tokens and s.num_reqs <= self.max_num_seqs
                and s.max_seq_len() <= self.max_model_len)

    def num_blocks(self, block_size: int) -> int:
        """KV blocks the largest shape needs, plus the null block."""
        return blocks_needed(self.shapes(), block_size)


def blocks_needed(shapes: Iterable[ShapeSpec], block_size: int) -> int:
    """KV blocks the largest of ``shapes`` needs, plus the null block."""
    return 1 + max((s.num_blocks(block_size) for s in shapes), default=1)


#: Idle durations after which ``StepProfiler.measure_wakeup`` times a step (seconds).
WAKEUP_IDLE_S: tuple[float, ...] = (0.002, 0.005, 0.01, 0.03, 0.1)

#: The step timed after idling: one lone prompt of this many tokens, what an idle engine wakes
#: up to.
WAKEUP_QUERY_LEN = 128

#: The speed probe: two fixed, small steps measured before and after every measured run and
#: with every profile, so a change of the machine's speed between them shows (shared hosts).
PROBE_SHAPES: tuple[ShapeSpec, ...] = (
    ShapeSpec("decode", (), (64,) * 4),
    ShapeSpec("prefill", ((64, 0),), ()),
)


def speed_probe(executor: TorchExecutor, repeats: int = 8, rounds: int = 3) -> float:
    """Mean time of the probe steps (seconds, summed over ``PROBE_SHAPES``)."""
    timing = ProfileGrid(warmup=1, repeats=repeats, rounds=rounds, seed=12345)
    rows = StepProfiler(executor).measure(PROBE_SHAPES, timing)
    return float(sum(r.stats.mean_s for r in rows))


def quick_grid(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
               **overrides: object) -> ProfileGrid:
    """A small grid (a few dozen shapes, one sample each round) for smoke runs and tests."""
    values: dict[str, object] = dict(
        prefill_query_lens=(16, 64, 256), prefill_context_lens=(0, 64),
        prefill_batch_sizes=(1, 2), partial_query_lens=(64,), decode_batch_sizes=(1, 4, 16),
        decode_context_lens=(16, 128), mixed_decode_batch_sizes=(4,), mixed_query_lens=(32,),
        mixed_prefill_counts=(1,), warmup=1, repeats=1, rounds=2,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
    )
    values.update(overrides)
    return ProfileGrid(**values)  # type: ignore[arg-type]


# -- measuring steps -----------------------------------------------------------------------------
@dataclass(slots=True)
class _Samples:
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)


class StepProfiler:
    """Replays grid shapes on one ``TorchExecutor`` (which it owns while profiling).

    The executor's KV cache must hold the largest shape (``ProfileGrid.num_blocks``); block
    contents are never read back, so stale KV does not matter for timing.
    """

    def __init__(self, executor: TorchExecutor, *, vocab_size: int | None = None) -> None:
        self.executor = executor
        self.block_size = executor.block_size
        self.vocab_size = vocab_size or executor.model_config.vocab_size
        self._step_id = 0
        self._live: set[str] = set()  # request ids the worker holds state for
        self._num_shapes = 0

    def profile(
        self,
        grid: ProfileGrid,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[ProfileRow]:
        """Measure every shape of ``grid``; one row per shape, in grid order."""
        return self.measure(grid.shapes(), grid, progress)

    def measure(
        self,
        shapes: Sequence[ShapeSpec],
        timing: ProfileGrid,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[ProfileRow]:
        """Measure ``shapes`` with ``timing``'s warm-up, repeats, rounds and seed."""
        need = blocks_needed(shapes, self.block_size)
        if need > self.executor.num_gpu_blocks:
            raise ValueError(
                f"the grid's largest shape needs {need} KV blocks, the executor has "
                f"{self.executor.num_gpu_blocks}: build it with num_gpu_blocks >= {need}"
            )
        rng = np.random.default_rng(timing.seed)
        samples = [_Samples() for _ in shapes]
        total = timing.rounds * len(shapes)
        done = 0
        for _ in range(timing.rounds):
            for i in rng.permutation(len(shapes)):
                self._measure(shapes[int(i)], timing, rng, samples[int(i)])
                done += 1
                if progress is not None:
                    progress(done, total)
        self._release()
        self.executor.step_timings.clear()
        return [
            ProfileRow(s.kind, "step", s.batch_shape(), s.num_tokens,
                       SampleStats.of(x.wall_s, x.cpu_s))
            for s, x in zip(shapes, samples, strict=True)
        ]

    def _measure(self, spec: ShapeSpec, grid: ProfileGrid, rng: np.random.Generator,
                 into: _Samples) -> None:
        first, replay, partial = self._schedules(spec, rng)
        self.executor.execute_model(first)
        for k in range(grid.warmup + grid.repeats):
            out = self._replay(replay, partial)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            self.executor.execute_model(out)
            wall = time.perf_counter() - t0
            cpu = time.thread_time() - c0
            if k >= grid.warmup:
                into.wall_s.append(wall)
                into.cpu_s.append(cpu)

    def measure_wakeup(
        self,
        spec: ShapeSpec,
        idle_s: Sequence[float] = WAKEUP_IDLE_S,
        *,
        samples: int = 10,
        seed: int = 0,
    ) -> list[ProfileRow]:
        """The step ``spec`` timed right after the thread slept ``idle_s`` (as the engine loop
        sleeps when it has nothing to do) and right after another step (back to back).

        Rows ``("loop", "wakeup", size=idle µs)``; size 0 holds the back-to-back samples, each
        taken right after one of the slept ones, so both see the same machine. The idle
        durations are visited in a seeded shuffled order, ``samples`` times each.
        """
        if samples < 1 or not idle_s or min(idle_s) <= 0:
            raise ValueError("measure_wakeup needs samples >= 1 and positive idle durations")
        rng = np.random.default_rng(seed)
        first, replay, partial = self._schedules(spec, rng)
        self.executor.execute_model(first)
        for _ in range(2):  # warm-up
            self.executor.execute_model(self._replay(replay, partial))
        after: dict[float, list[float]] = {d: [] for d in idle_s}
        back_to_back: list[float] = []
        for _ in range(samples):
            for i in rng.permutation(len(idle_s)):
                d = idle_s[int(i)]
                slept, next_one = self._replay(replay, partial), self._replay(replay, partial)
                time.sleep(d)
                t0 = time.perf_counter()
                self.executor.execute_model(slept)
                t1 = time.perf_counter()
                self.executor.execute_model(next_one)
                after[d].append(t1 - t0)
                back_to_back.append(time.perf_counter() - t1)
        self._release()
        self.executor.step_timings.clear()
        return [stats_row("loop", "wakeup", 0, back_to_back)] + [
            stats_row("loop", "wakeup", round(d * 1e6), after[d]) for d in idle_s
        ]

    def _schedules(
        self, spec: ShapeSpec, rng: np.random.Generator
    ) -> tuple[SchedulerOutput, dict[str, tuple[int, int]], set[str]]:
        """The registering step (new requests), the replayed step's (computed, scheduled) per
        request, and the requests that sample nothing (non-final chunks)."""
        self._num_shapes += 1
        tag = f"p{self._num_shapes}-"
        lens = [(1, c) for c in spec.decode_context_lens] + list(spec.prefill_chunks)
        first_chunk = len(spec.decode_context_lens)
        partial = {f"{tag}{first_chunk + j}" for j in range(spec.num_partial)}
        params = SamplingParams(max_tokens=1 << 20, ignore_eos=True, temperature=0.0)
        low = min(FIRST_PLAIN_TOKEN, self.vocab_size - 1)
        next_block = 1
        new_reqs: list[NewRequestData] = []
        replay: dict[str, tuple[int, int]] = {}
        for j, (q, ctx) in enumerate(lens):
            req_id = f"{tag}{j}"
            seq = ctx + q + 1
            num_blocks = -(-seq // self.block_size)
            blocks = list(range(next_block, next_block + num_blocks))
            next_block += num_blocks
            ids = rng.integers(low, self.vocab_size, ctx + q).tolist()
            new_reqs.append(NewRequestData(req_id, ids, ctx + q, params, None, blocks, ctx))
            replay[req_id] = (ctx, q)
        first = self._output(new_reqs, CachedRequestData(), replay, partial,
                             finished=self._live)
        self._live = set(replay)
        return first, replay, partial

    def _replay(self, replay: dict[str, tuple[int, int]], partial: set[str]) -> SchedulerOutput:
        ids = list(replay)
        cached = CachedRequestData(
            req_ids=ids,
            new_block_ids=[None] * len(ids),
            num_computed_tokens=[replay[r][0] for r in ids],
            num_output_tokens=[0] * len(ids),
        )
        return self._output([], cached, replay, partial, finished=set())

    def _output(self, new_reqs: list[NewRequestData], cached: CachedRequestData,
                replay: dict[str, tuple[int, int]], partial: set[str], *,
                finished: set[str]) -> SchedulerOutput:
        scheduled = {r: q for r, (_, q) in replay.items()}
        shape = _shape_of(replay, len(partial))
        out = SchedulerOutput(
            step_id=self._step_id,
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
            partial_prefill_req_ids=set(partial),
            preempted_req_ids=set(),
            finished_req_ids=set(finished),
            batch_shape=shape,
            admission_blocker=AdmissionBlocker.NONE,
        )
        self._step_id += 1
        return out

    def _release(self) -> None:
        """Drop the worker's state of the last shape (an empty step carrying finished ids)."""
        if self._live:
            self.executor.execute_model(self._output([], CachedRequestData(), {}, set(),
                                                     finished=self._live))
            self._live = set()


def _shape_of(replay: dict[str, tuple[int, int]], num_partial: int) -> BatchShape:
    """``BatchShape`` of (context, query) pairs in scheduling order."""
    pq = [q for c, q in replay.values() if q > 1]
    pc = [c for c, q in replay.values() if q > 1]
    dec = [c for c, q in replay.values() if q == 1]
    return BatchShape(
        num_reqs=len(replay), num_tokens=sum(q for _, q in replay.values()),
        prefill_query_lens=tuple(pq), prefill_context_lens=tuple(pc),
        num_decode_reqs=len(dec), decode_context_sum=sum(dec),
        decode_context_max=max(dec, default=0), num_sampling_reqs=len(replay) - num_partial,
    )


# -- per-unit costs ------------------------------------------------------------------------------
def time_unit_costs(
    kind: str,
    name: str,
    fn: Callable[[int], object],
    sizes: Sequence[int],
    *,
    repeats: int = 7,
    warmup: int = 2,
    inner: int = 1,
) -> list[ProfileRow]:
    """Time ``fn(size)`` for each size (``inner`` calls per sample, the mean kept); one row per
    size. ``fn`` must leave no state that changes the next call's cost."""
    if repeats < 1 or inner < 1:
        raise ValueError("repeats and inner must be >= 1")
    rows = []
    for size in sizes:
        walls: list[float] = []
        cpus: list[float] = []
        for k in range(warmup + repeats):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn(size)
            wall = (time.perf_counter() - t0) / inner
            cpu = (time.thread_time() - c0) / inner
            if k >= warmup:
                walls.append(wall)
                cpus.append(cpu)
        rows.append(ProfileRow(kind, name, None, int(size), SampleStats.of(walls, cpus)))
    return rows


def stats_row(kind: str, name: str, size: int, wall_s: Sequence[float],
              size2: int = 0) -> ProfileRow:
    """A unit-cost row from timings measured elsewhere (e.g. a real run's step records)."""
    return ProfileRow(kind, name, None, int(size), SampleStats.of(wall_s), int(size2))
