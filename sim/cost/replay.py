"""Replayed steps: a cost model that returns the durations a measured run's steps took.

The decomposition of a validation's error (``twinserve validate``): simulate a measured run
once more with this model, and what differs from the measurement is no longer the cost model's
doing — it is the structure's (queueing, scheduling, IPC, the output path). The difference to
the fitted model's run is then the cost model's own error.

Each measured step is keyed by its full ``BatchShape``; the *k*-th time the simulated engine
asks for a shape it gets the duration of the *k*-th measured step of that shape, so a simulation
that forms the measured batches in the measured order replays every step exactly. A shape
asked for more often than it was measured gets the mean of its measurements. A shape never
measured (the simulated batches went their own way — typically a decode whose contexts differ
by a token, or a prefill that joined another step) takes the measured steps of its *kind* —
the same numbers of requests, tokens, decodes, prefill chunks and sampling rows — at their
mean, moved by the ``fallback`` model's ratio between this shape and them; a shape of a kind
never measured gets the ``fallback`` model's time. The counts of the four cases
(``ReplayStats``) say how closely the simulation followed the measured batches.

The model keeps state (which measured step comes next), so a run that uses it must ask once
per executed step, in order: the simulator does with its bulk fast path off
(``SimConfig.fast_path=False``). Durations include whatever the measured steps paid (a cold
start after idling, contention on the host), so a replay adds no wake-up cost of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.interfaces import CostModel, StepTime
from engine.core.outputs import BatchShape


@dataclass(slots=True)
class ReplayStats:
    """How the simulated steps matched the measured ones."""

    replayed: int = 0  # got a measured step's own duration
    repeated: int = 0  # a measured shape asked for once more than measured: its mean
    similar: int = 0  # a shape never measured, of a measured kind: their mean, moved
    fallback: int = 0  # a shape of a kind never measured: the fallback model's time

    @property
    def total(self) -> int:
        return self.replayed + self.repeated + self.similar + self.fallback


def kind_of(shape: BatchShape) -> tuple[int, int, int, int, int]:
    """What a step's duration mostly depends on: requests, tokens, decodes, prefill chunks and
    sampling rows (not the exact contexts)."""
    return (shape.num_reqs, shape.num_tokens, shape.num_decode_reqs,
            len(shape.prefill_query_lens), shape.num_sampling_reqs)


class ReplayCostModel:
    """``CostModel`` replaying measured step durations by batch shape (module docstring)."""

    def __init__(self, steps: Sequence[tuple[BatchShape, float]], fallback: CostModel) -> None:
        self._durations: dict[BatchShape, list[float]] = {}
        for shape, duration_s in steps:
            if not duration_s >= 0.0:
                raise ValueError(f"a measured step lasts >= 0 s, got {duration_s}")
            self._durations.setdefault(shape, []).append(float(duration_s))
        self._next: dict[BatchShape, int] = dict.fromkeys(self._durations, 0)
        self._fallback = fallback
        self._steps_of_kind: dict[tuple[int, int, int, int, int],
                                  list[tuple[BatchShape, float]]] = {}
        for shape, duration_s in steps:
            self._steps_of_kind.setdefault(kind_of(shape), []).append((shape, float(duration_s)))
        # per kind, when first needed: (mean measured, mean fallback prediction) of its steps
        self._kinds: dict[tuple[int, int, int, int, int], tuple[float, float]] = {}
        self.stats = ReplayStats()

    def _kind(self, shape: BatchShape) -> tuple[float, float] | None:
        key = kind_of(shape)
        if key not in self._kinds:
            measured = self._steps_of_kind.get(key)
            if not measured:
                return None
            predicted = [self._fallback.step_time(s).total_s for s, _ in measured]
            self._kinds[key] = (sum(d for _, d in measured) / len(measured),
                                sum(predicted) / len(predicted))
        return self._kinds[key]

    def step_time(self, shape: BatchShape) -> StepTime:
        if shape.num_tokens == 0:
            return StepTime(total_s=0.0)
        measured = self._durations.get(shape)
        if measured is None:
            predicted = self._fallback.step_time(shape).total_s
            kind = self._kind(shape)
            if kind is None or kind[1] <= 0.0:
                self.stats.fallback += 1
                return StepTime(total_s=predicted)
            self.stats.similar += 1
            return StepTime(total_s=kind[0] * predicted / kind[1])
        k = self._next[shape]
        if k < len(measured):
            self._next[shape] = k + 1
            self.stats.replayed += 1
            return StepTime(total_s=measured[k])
        self.stats.repeated += 1
        return StepTime(total_s=sum(measured) / len(measured))
