"""An engine step as a record, several as columns: the two shapes ``EventLog`` takes.

``StepRecord`` is one step (one ``schedule()`` and its applied output), as the engine observes
it; ``StepColumns`` holds several steps, one list per ``StepRecord`` field (what the bulk path
records for a run of iterations, and what a saved log is loaded from). ``EventLog.record_step``
and ``record_steps`` are their writers; the log stores each field as a typed column
(``STEP_TYPECODES``) and ``typed_column`` converts a field's values to it, refusing values that
do not fit with a ``TypeError`` naming the field.
"""

from __future__ import annotations

import functools
import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final


@dataclass(slots=True)
class StepRecord:
    """One engine step (one ``schedule()`` and its applied output).

    Not frozen, unlike most records: every step builds one, and a frozen record's ``__init__``
    (22 ``object.__setattr__`` calls) costs about 2 µs from the Python sources, a plain one
    0.4 µs. Nothing changes a record once it is built.
    """

    step_id: int  # index of the schedule() call
    schedule_time_s: float  # when schedule() ran
    execute_start_s: float  # when the executor started the batch
    execute_end_s: float  # when the executor finished it
    update_time_s: float  # when update_from_output applied it (token time in the engine)
    num_reqs: int  # scheduled requests
    num_tokens: int  # scheduled tokens
    num_prefill_reqs: int  # requests computing > 1 token
    num_prefill_tokens: int
    num_decode_reqs: int  # requests computing exactly 1 token
    decode_context_sum: int  # Σ cached context of the decodes
    num_sampled_tokens: int  # output tokens this step produced
    num_new_reqs: int  # first admissions
    num_resumed_reqs: int  # resumptions after preemption
    num_preempted_reqs: int  # preemptions during schedule()
    num_finished_reqs: int  # requests finished by this update
    num_running: int  # after the update
    num_waiting: int  # after the update
    kv_usage: float  # 1 - free / usable blocks, after the update
    admission_blocker: str  # why admissions stopped this step ("" if the queue drained)
    cost_s: float  # the step time the executor reported (simulated or measured)
    replica: int  # data-parallel rank of the engine that ran the step

    # Written-out __init__s: compiled by mypyc (see engine/core/outputs.py's docstring).
    def __init__(
        self,
        step_id: int,
        schedule_time_s: float,
        execute_start_s: float,
        execute_end_s: float,
        update_time_s: float,
        num_reqs: int,
        num_tokens: int,
        num_prefill_reqs: int,
        num_prefill_tokens: int,
        num_decode_reqs: int,
        decode_context_sum: int,
        num_sampled_tokens: int,
        num_new_reqs: int,
        num_resumed_reqs: int,
        num_preempted_reqs: int,
        num_finished_reqs: int,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        admission_blocker: str,
        cost_s: float,
        replica: int,
    ) -> None:
        self.step_id = step_id
        self.schedule_time_s = schedule_time_s
        self.execute_start_s = execute_start_s
        self.execute_end_s = execute_end_s
        self.update_time_s = update_time_s
        self.num_reqs = num_reqs
        self.num_tokens = num_tokens
        self.num_prefill_reqs = num_prefill_reqs
        self.num_prefill_tokens = num_prefill_tokens
        self.num_decode_reqs = num_decode_reqs
        self.decode_context_sum = decode_context_sum
        self.num_sampled_tokens = num_sampled_tokens
        self.num_new_reqs = num_new_reqs
        self.num_resumed_reqs = num_resumed_reqs
        self.num_preempted_reqs = num_preempted_reqs
        self.num_finished_reqs = num_finished_reqs
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.kv_usage = kv_usage
        self.admission_blocker = admission_blocker
        self.cost_s = cost_s
        self.replica = replica


@dataclass(frozen=True, slots=True)
class StepColumns:
    """Several engine steps as columns: one equal-length list per ``StepRecord`` field (what
    the bulk path records for a run of iterations, and what a saved log is loaded from)."""

    step_id: list[int]
    schedule_time_s: list[float]
    execute_start_s: list[float]
    execute_end_s: list[float]
    update_time_s: list[float]
    num_reqs: list[int]
    num_tokens: list[int]
    num_prefill_reqs: list[int]
    num_prefill_tokens: list[int]
    num_decode_reqs: list[int]
    decode_context_sum: list[int]
    num_sampled_tokens: list[int]
    num_new_reqs: list[int]
    num_resumed_reqs: list[int]
    num_preempted_reqs: list[int]
    num_finished_reqs: list[int]
    num_running: list[int]
    num_waiting: list[int]
    kv_usage: list[float]
    admission_blocker: list[str]
    cost_s: list[float]
    replica: list[int]

    def __init__(
        self,
        step_id: list[int],
        schedule_time_s: list[float],
        execute_start_s: list[float],
        execute_end_s: list[float],
        update_time_s: list[float],
        num_reqs: list[int],
        num_tokens: list[int],
        num_prefill_reqs: list[int],
        num_prefill_tokens: list[int],
        num_decode_reqs: list[int],
        decode_context_sum: list[int],
        num_sampled_tokens: list[int],
        num_new_reqs: list[int],
        num_resumed_reqs: list[int],
        num_preempted_reqs: list[int],
        num_finished_reqs: list[int],
        num_running: list[int],
        num_waiting: list[int],
        kv_usage: list[float],
        admission_blocker: list[str],
        cost_s: list[float],
        replica: list[int],
    ) -> None:
        object.__setattr__(self, "step_id", step_id)
        object.__setattr__(self, "schedule_time_s", schedule_time_s)
        object.__setattr__(self, "execute_start_s", execute_start_s)
        object.__setattr__(self, "execute_end_s", execute_end_s)
        object.__setattr__(self, "update_time_s", update_time_s)
        object.__setattr__(self, "num_reqs", num_reqs)
        object.__setattr__(self, "num_tokens", num_tokens)
        object.__setattr__(self, "num_prefill_reqs", num_prefill_reqs)
        object.__setattr__(self, "num_prefill_tokens", num_prefill_tokens)
        object.__setattr__(self, "num_decode_reqs", num_decode_reqs)
        object.__setattr__(self, "decode_context_sum", decode_context_sum)
        object.__setattr__(self, "num_sampled_tokens", num_sampled_tokens)
        object.__setattr__(self, "num_new_reqs", num_new_reqs)
        object.__setattr__(self, "num_resumed_reqs", num_resumed_reqs)
        object.__setattr__(self, "num_preempted_reqs", num_preempted_reqs)
        object.__setattr__(self, "num_finished_reqs", num_finished_reqs)
        object.__setattr__(self, "num_running", num_running)
        object.__setattr__(self, "num_waiting", num_waiting)
        object.__setattr__(self, "kv_usage", kv_usage)
        object.__setattr__(self, "admission_blocker", admission_blocker)
        object.__setattr__(self, "cost_s", cost_s)
        object.__setattr__(self, "replica", replica)

    def lists(self) -> tuple[list[Any], ...]:
        """The columns in ``STEP_COLUMNS`` order."""
        return (
            self.step_id,
            self.schedule_time_s,
            self.execute_start_s,
            self.execute_end_s,
            self.update_time_s,
            self.num_reqs,
            self.num_tokens,
            self.num_prefill_reqs,
            self.num_prefill_tokens,
            self.num_decode_reqs,
            self.decode_context_sum,
            self.num_sampled_tokens,
            self.num_new_reqs,
            self.num_resumed_reqs,
            self.num_preempted_reqs,
            self.num_finished_reqs,
            self.num_running,
            self.num_waiting,
            self.kv_usage,
            self.admission_blocker,
            self.cost_s,
            self.replica,
        )

    @staticmethod
    def from_mapping(columns: Mapping[str, Sequence[object]]) -> StepColumns:
        """Named columns from outside the engine (a saved log, a DataFrame), checked now: every
        ``StepRecord`` field once with equal lengths (else ``ValueError``), every value of its
        column's type (else ``TypeError`` naming the column), so a bad file is refused before
        anything is recorded."""
        lengths = {len(v) for v in columns.values()}
        if set(columns) != set(STEP_COLUMNS) or len(lengths) > 1:
            raise ValueError(
                f"step columns need {len(STEP_COLUMNS)} columns, one equal-length list per "
                "StepRecord field"
            )
        lists: list[Any] = [list(columns[name]) for name in STEP_COLUMNS]
        for name, values in zip(STEP_COLUMNS, lists, strict=True):
            typed_column(name, values)
        return StepColumns(*lists)


STEP_COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(StepRecord))

#: Storage of each step column: an ``array`` typecode ("q" int64, "i" int32, "d" float64), or
#: "" for the one string column (a list).
STEP_TYPECODES: Final[dict[str, str]] = {
    f.name: (
        "" if f.type in ("str", str)
        else "q" if f.name in ("step_id", "decode_context_sum")
        else "i" if f.type in ("int", int)
        else "d"
    )
    for f in fields(StepRecord)
}


def typed_column(name: str, values: list[object]) -> Any:
    """Column ``name``'s ``values`` converted to its storage: an ``array`` (``packed_array``),
    with the same type rules — ints for integer columns, ints or floats for float columns,
    nothing that does not fit — or the list itself for the string column. A value that does
    not fit raises ``TypeError`` naming it."""
    typecode = STEP_TYPECODES[name]
    if not typecode:
        if not all(isinstance(v, str) for v in values):
            raise TypeError(f"step column {name!r} takes strings")
        return values
    try:
        return packed_array(typecode, values)
    except (TypeError, OverflowError) as exc:
        kind = "floats" if typecode == "d" else "integers"
        raise TypeError(f"step column {name!r} takes {kind}: {exc}") from None


def packed_array(typecode: str, values: list[Any]) -> Any:
    """``values`` as an ``array`` of ``typecode``, packed by ``struct`` (about twice as fast per
    value as ``array.fromlist``); a value that does not fit raises as ``array.fromlist`` would
    (``TypeError`` or ``OverflowError``), and nothing is returned half-filled."""
    block: Any = array(typecode)
    try:
        block.frombytes(_packer(typecode, len(values)).pack(*values))
        return block
    except (struct.error, TypeError, OverflowError):
        pass
    block = array(typecode)  # array's own conversion decides (and words the error)
    block.fromlist(values)
    return block


@functools.lru_cache(maxsize=256)  # the log packs blocks of a few dozen sizes
def _packer(typecode: str, count: int) -> struct.Struct:
    """A ``Struct`` packing ``count`` values of ``typecode``. ``Struct.pack(*values)`` takes
    the values as they are; ``struct.pack(format, *values)`` copies them once more, into the
    tuple without the format (≈ 25% of the packing of a block of 2,048 floats)."""
    return struct.Struct(f"{count}{typecode}")
