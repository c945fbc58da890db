"""The per-request event record both worlds write, and the log that holds it compactly.

Every metric of a report is derived from this log, identically for simulated and real runs
(ARCHITECTURE.md §4, METRICS.md). A ``RequestEvent`` is ``(req_id, kind, time_s, payload)``.
Stage events (arrival, front end, engine queue, scheduling, preemption, finish) are stored as
rows. Token events are stored compactly, because a run produces one per generated token:

* every engine step ``s`` has one ``StepRecord`` (when it was scheduled, ran, was applied;
  ``step_records.py``), and the output path later records when that step's outputs reached
  the client (``record_delivery``);
* each request's tokens are kept as *runs* ``(req, first_step, num_tokens)``: a request that
  gets one token in each of steps ``s, s+1, …, s+n-1`` is one run. Token ``i`` of a run was
  produced at ``steps[first_step + i].update_time_s`` and delivered at the step's delivery time.

``iter_events()`` expands this back into one ``RequestEvent`` per token (for tests and small
logs); reports use the columnar ``to_columns()`` views, which stay vectorisable at millions of
requests.

A request's *labels* — its tenant and SLO class, when the workload gives them — are recorded
once, at its arrival (``record_labels``), so reports can break results down by them.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

# Re-exported: the step records are part of the log's interface (reports read STEP_COLUMNS).
from engine.core.step_records import STEP_COLUMNS as STEP_COLUMNS
from engine.core.step_records import STEP_TYPECODES, packed_array, typed_column
from engine.core.step_records import StepColumns as StepColumns
from engine.core.step_records import StepRecord as StepRecord


class EventKind(enum.IntEnum):
    """Stage boundaries on the request path (METRICS.md §3), in path order."""

    ARRIVAL = 0  # the client sends the request
    FRONTEND_START = 1  # an API-server process picks it up
    TOKENIZED = 2  # template + tokenization done; sent to the engine
    ENGINE_ENQUEUED = 3  # the engine core added it to the waiting queue
    SCHEDULED = 4  # admitted to RUNNING (first time and each resume); payload: prefix-hit tokens
    PREEMPTED = 5  # evicted back to WAITING
    FIRST_TOKEN = 6  # first output token applied in the engine
    TOKEN = 7  # an output token applied in the engine (expanded from runs)
    FINISHED = 8  # the engine finished it; payload: finish reason
    DELIVERED = 9  # the client received the final chunk
    REJECTED = 10  # refused before running; payload: reason


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One timestamped stage boundary of one request."""

    req_id: str
    kind: EventKind
    time_s: float
    payload: int | str | None = None  # kind-specific (see EventKind)


#: Steps buffered (as Python objects) before they are converted into the typed columns
#: (≈ 400 bytes a step). Few enough that the buffer is still in the CPU's caches when it is
#: packed: with 16,384 the loop of Vidur's stream took ≈ 5% more CPU, with 1,024 the same.
STEP_ROWS_BUFFERED: Final = 2048

#: Stage events buffered the same way (≈ 100 bytes an event).
EVENTS_BUFFERED: Final = 2048


class EventLog:
    """Append-only store of request events, token runs and step records (typed arrays)."""

    def __init__(self) -> None:
        self._req_index: dict[str, int] = {}
        self.req_ids: list[str] = []
        # stage events
        self._ev_req = array("i")
        self._ev_kind = array("b")
        self._ev_time = array("d")
        self._ev_payload: list[int | str | None] = []
        # events not yet in the columns (all four join together, so columns a reader holds
        # stay of one length): a list append is a native call in the compiled build, an
        # array's is a method looked up every time
        self._ev_buf_req: list[int] = []
        self._ev_buf_kind: list[int] = []
        self._ev_buf_time: list[float] = []
        self._ev_buf_payload: list[int | str | None] = []
        # token runs: finished runs, plus the open run of each live request
        self._run_req = array("i")
        self._run_first = array("q")
        self._run_count = array("q")
        # req_id -> [first_step, count, req index]: keyed by the id the engine passes, so that
        # adding a token (every request, every step-by-step step) takes one dict lookup
        self._open_runs: dict[str, list[int]] = {}
        # steps
        self._steps: dict[str, array[int] | array[float] | list[str]] = {
            name: array(code) if code else [] for name, code in STEP_TYPECODES.items()
        }
        self._num_steps_stored = 0  # rows of ``_steps`` in use (see ``_append_columns``)
        # steps not yet in the typed columns: single records, and column buffers before them
        self._step_records: list[StepRecord] = []
        self._step_buf: list[list[object]] = [[] for _ in STEP_COLUMNS]
        self._num_buffered = 0  # steps in the column buffers
        # step deliveries as two parallel typed arrays (a dict would cost ~100 bytes a step)
        self._delivered_step = array("q")
        self._delivered_time = array("d")
        # labels of the requests that have them: req index -> (tenant, SLO class name)
        self._labels: dict[int, tuple[str, str]] = {}

    # -- writing --------------------------------------------------------------------------------
    def index_of(self, req_id: str) -> int:
        idx = self._req_index.get(req_id)
        if idx is None:
            idx = self._req_index[req_id] = len(self.req_ids)
            self.req_ids.append(req_id)
        return idx

    def record(
        self, req_id: str, kind: EventKind, time_s: float, payload: int | str | None = None
    ) -> None:
        """One stage event. Its values join the columns, and are checked, with the other
        buffered events (every ``EVENTS_BUFFERED`` events, or when the columns are read): a
        value that does not fit raises then, and the buffered events stay (every later read
        raises again; nothing is dropped). The compiled build checks the types at the call."""
        self._ev_buf_req.append(self.index_of(req_id))
        self._ev_buf_kind.append(kind)
        self._ev_buf_time.append(time_s)
        self._ev_buf_payload.append(payload)
        if len(self._ev_buf_req) >= EVENTS_BUFFERED:
            self._flush_events()

    def _flush_events(self) -> None:
        """Move the buffered events into the typed columns."""
        if not self._ev_buf_req:
            return
        req = packed_array("i", self._ev_buf_req)  # all converted before any is appended
        kind = packed_array("b", self._ev_buf_kind)
        time_s = packed_array("d", self._ev_buf_time)
        self._ev_req.extend(req)
        self._ev_kind.extend(kind)
        self._ev_time.extend(time_s)
        self._ev_payload.extend(self._ev_buf_payload)
        self._ev_buf_req, self._ev_buf_kind, self._ev_buf_time = [], [], []
        self._ev_buf_payload = []

    def record_labels(self, req_id: str, tenant: str, slo_class: str) -> None:
        """The request's tenant and SLO class name ("" for none)."""
        self._labels[self.index_of(req_id)] = (tenant, slo_class)

    def record_token(self, req_id: str, step_id: int) -> None:
        """One output token of ``req_id`` applied in step ``step_id`` (steps increasing):
        ``record_tokens(req_id, step_id, 1)``, written out because every request of every
        step-by-step step passes here (delegating measured ≈ 1% more loop CPU on such runs)."""
        run = self._open_runs.get(req_id)
        if run is not None:
            if run[0] + run[1] == step_id:
                run[1] += 1
                return
            self._close_run(run)
            run[0], run[1] = step_id, 1
            return
        self._open_runs[req_id] = [step_id, 1, self._req_index[req_id]]

    def record_tokens(self, req_id: str, first_step: int, count: int) -> None:
        """``count`` consecutive tokens of ``req_id``, the first applied in step ``first_step``
        (a bulk run's: steps increasing per request)."""
        if not count:
            return
        run = self._open_runs.get(req_id)
        if run is None:
            self._open_runs[req_id] = [first_step, count, self._req_index[req_id]]
        elif run[0] + run[1] == first_step:
            run[1] += count
        else:
            self._close_run(run)
            run[0], run[1] = first_step, count

    def close_request(self, req_id: str) -> None:
        """The request will produce no more tokens: move its open run to the finished ones."""
        run = self._open_runs.pop(req_id, None)
        if run is not None:
            self._close_run(run)

    def record_step(self, step: StepRecord) -> None:
        """One engine step. Its values are converted, and their types checked, when the
        buffered steps join the typed columns (``steps_columns``, or every
        ``STEP_ROWS_BUFFERED`` steps): a value that does not fit then raises ``TypeError``
        naming its column, and no buffered step joins."""
        self._step_records.append(step)
        if len(self._step_records) + self._num_buffered >= STEP_ROWS_BUFFERED:
            self._flush_steps()

    def record_steps(self, steps: StepColumns) -> None:
        """Several engine steps at once (``StepColumns.from_mapping`` checks columns from
        outside first). Unequal columns raise ``ValueError`` at once; values are checked as
        ``record_step``'s are, when the steps join the typed columns."""
        lists = steps.lists()
        n = len(lists[0])
        for column in lists:
            if len(column) != n:
                raise ValueError("record_steps needs equal-length columns")
        self._records_to_buffer()
        buf = self._step_buf
        for j in range(len(lists)):
            buf[j].extend(lists[j])
        self._num_buffered += n
        if self._num_buffered >= STEP_ROWS_BUFFERED:
            self._flush_steps()

    def _records_to_buffer(self) -> None:
        """Move the buffered records into the column buffers (in ``STEP_COLUMNS`` order)."""
        records = self._step_records
        if not records:
            return
        # written out field by field (no row tuples): every step passes here
        (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10,
         b11, b12, b13, b14, b15, b16, b17, b18, b19, b20, b21) = self._step_buf
        for r in records:
            b0.append(r.step_id)
            b1.append(r.schedule_time_s)
            b2.append(r.execute_start_s)
            b3.append(r.execute_end_s)
            b4.append(r.update_time_s)
            b5.append(r.num_reqs)
            b6.append(r.num_tokens)
            b7.append(r.num_prefill_reqs)
            b8.append(r.num_prefill_tokens)
            b9.append(r.num_decode_reqs)
            b10.append(r.decode_context_sum)
            b11.append(r.num_sampled_tokens)
            b12.append(r.num_new_reqs)
            b13.append(r.num_resumed_reqs)
            b14.append(r.num_preempted_reqs)
            b15.append(r.num_finished_reqs)
            b16.append(r.num_running)
            b17.append(r.num_waiting)
            b18.append(r.kv_usage)
            b19.append(r.admission_blocker)
            b20.append(r.cost_s)
            b21.append(r.replica)
        self._num_buffered += len(records)
        self._step_records = []

    def _flush_steps(self) -> None:
        """Convert every buffered step into the typed columns (all of them, or none)."""
        self._records_to_buffer()
        if not self._num_buffered:
            return
        self._append_columns(self._step_buf)
        self._step_buf = [[] for _ in STEP_COLUMNS]
        self._num_buffered = 0

    def _append_columns(self, columns: list[list[object]]) -> None:
        """Convert each column (``STEP_COLUMNS`` order) to its storage, then append them all
        (or nothing: a value that does not fit raises ``TypeError`` naming its column).

        The stored columns grow by a quarter of their length at a time and hold unused rows
        at their end until read (``_stored_steps``), so a column is copied about 4 times its
        final size over a run: extended in place, an ``array`` grows by 1/16, and each growth
        the allocator cannot make in place copies it — about 16 times its final size. Not by
        half: the unused rows are resident (their zeros are written), and at two million steps
        a half-grown log raised the run's peak memory by ≈ 60 MB."""
        converted = [
            typed_column(name, values) for name, values in zip(STEP_COLUMNS, columns, strict=True)
        ]
        start = self._num_steps_stored
        stop = start + len(converted[0])
        for name, block in zip(STEP_COLUMNS, converted, strict=True):
            column = self._steps[name]
            if len(column) < stop:
                _grow(column, max(stop, len(column) * 5 // 4))
            column[start:stop] = block
        self._num_steps_stored = stop

    def _stored_steps(self) -> dict[str, array[int] | array[float] | list[str]]:
        """The step columns with every step recorded so far, and no unused row."""
        self._flush_steps()
        n = self._num_steps_stored
        for column in self._steps.values():
            if len(column) > n:
                del column[n:]
        return self._steps

    def record_delivery(self, step_id: int, time_s: float) -> None:
        """The outputs of ``step_id`` reached the client at ``time_s``."""
        self._delivered_step.append(step_id)
        self._delivered_time.append(time_s)

    def record_deliveries(self, step_ids: list[int], times_s: list[float]) -> None:
        """``record_delivery`` for several steps (equal-length lists)."""
        if len(step_ids) != len(times_s):
            raise ValueError(f"{len(step_ids)} steps but {len(times_s)} delivery times")
        self._delivered_step.fromlist(step_ids)
        self._delivered_time.fromlist(times_s)

    def compact_step_ids(self, stride: int) -> None:
        """Renumber steps of several engines (engine r's ids start at ``r * stride``) into one
        dense range: engine 0's steps first, then engine 1's, … Token runs and deliveries
        follow. Call once, after the run."""
        import numpy as np

        ids = np.asarray(self._stored_steps()["step_id"], dtype=np.int64)
        if ids.size == 0:
            return
        engines = ids // stride
        counts = np.bincount(engines)
        offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))

        def remap(values: np.ndarray) -> np.ndarray:
            e = values // stride
            remapped: np.ndarray = values - e * stride + offsets[e]
            return remapped

        self._steps["step_id"] = array("q", remap(ids).tolist())
        for run in self._open_runs.values():
            run[0] = int(remap(np.array([run[0]]))[0])
        if len(self._run_first):
            self._run_first = array("q", remap(np.asarray(self._run_first)).tolist())
        if len(self._delivered_step):
            self._delivered_step = array(
                "q", remap(np.asarray(self._delivered_step, dtype=np.int64)).tolist()
            )

    def _close_run(self, run: list[int]) -> None:
        self._run_req.append(run[2])
        self._run_first.append(run[0])
        self._run_count.append(run[1])

    # -- reading --------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self._num_steps_stored + self._num_buffered + len(self._step_records)

    def events_columns(self) -> dict[str, object]:
        """Stage events as columns: req_index, kind, time_s, payload."""
        self._flush_events()
        return {
            "req_index": self._ev_req,
            "kind": self._ev_kind,
            "time_s": self._ev_time,
            "payload": self._ev_payload,
        }

    def token_runs(self) -> dict[str, array[int]]:
        """All token runs (finished and open) as columns: req_index, first_step, num_tokens.

        The order of the runs carries no meaning (it depends on when each was closed); read
        them as a set, or use ``iter_events``, which orders them."""
        req, first, count = array("i", self._run_req), array("q", self._run_first), array(
            "q", self._run_count
        )
        for f, c, idx in self._open_runs.values():
            req.append(idx)
            first.append(f)
            count.append(c)
        return {"req_index": req, "first_step": first, "num_tokens": count}

    def steps_columns(self) -> dict[str, object]:
        """Every step recorded so far, one column per ``STEP_COLUMNS`` name: the log's own
        storage, not a copy — a step recorded later may lengthen these columns with unused
        rows (``_append_columns``), so read them again rather than keep them."""
        return dict(self._stored_steps())

    def labels_columns(self) -> dict[str, list[int] | list[str]]:
        """Request labels as columns: req_index, tenant, slo_class (requests with labels)."""
        items = sorted(self._labels.items())
        return {
            "req_index": [i for i, _ in items],
            "tenant": [t for _, (t, _c) in items],
            "slo_class": [c for _, (_t, c) in items],
        }

    def delivered_times(self) -> dict[int, float]:
        """{step id: time its outputs reached the clients} (a step is delivered at most once)."""
        return dict(zip(self._delivered_step, self._delivered_time, strict=True))

    def delivered_columns(self) -> dict[str, array[int] | array[float]]:
        """The same as columns: step_id, time_s (in recording order)."""
        return {"step_id": self._delivered_step, "time_s": self._delivered_time}

    def export(self) -> dict[str, Any]:
        """What the reports read, as plain arrays and lists (picklable: for a report process;
        ``reports.tables.ExportedLog`` reads it)."""
        return {
            "req_ids": self.req_ids,
            "events": self.events_columns(),
            "token_runs": self.token_runs(),
            "steps": self.steps_columns(),
            "delivered": self.delivered_columns(),
            "labels": self.labels_columns(),
        }

    def take_export(self) -> dict[str, Any]:
        """``export()`` that moves the storage out instead of sharing it: the log is left
        empty, so whoever takes the export holds the only copy (a report process can free
        each column once it is read; a million-request log is ≈ 0.6 GB)."""
        exported = self.export()
        empty = EventLog()
        self._req_index, self.req_ids, self._labels = empty._req_index, [], {}
        self._ev_req, self._ev_kind = empty._ev_req, empty._ev_kind
        self._ev_time, self._ev_payload = empty._ev_time, []
        self._run_req, self._run_first = empty._run_req, empty._run_first
        self._run_count, self._open_runs = empty._run_count, {}
        self._steps, self._step_records = empty._steps, []  # export() flushed the buffers
        self._num_steps_stored = 0
        self._delivered_step, self._delivered_time = empty._delivered_step, empty._delivered_time
        return exported

    @classmethod
    def from_export(cls, exported: Mapping[str, Any]) -> EventLog:
        """A log holding what ``export()`` returns (copied; its token runs all closed): how
        the logs of a run's shards, merged, become one log again (``sim/fleet.py``)."""
        log = cls()
        req_ids = list(exported["req_ids"])
        log.req_ids = req_ids
        log._req_index = {req_id: i for i, req_id in enumerate(req_ids)}
        if len(log._req_index) != len(req_ids):
            raise ValueError("exported req_ids repeat a request")
        ev = exported["events"]
        log._ev_req = array("i", ev["req_index"])
        log._ev_kind = array("b", ev["kind"])
        log._ev_time = array("d", ev["time_s"])
        log._ev_payload = list(ev["payload"])
        runs = exported["token_runs"]
        log._run_req = array("i", runs["req_index"])
        log._run_first = array("q", runs["first_step"])
        log._run_count = array("q", runs["num_tokens"])
        steps = exported["steps"]
        log._steps = {
            name: array(code, steps[name]) if code else list(steps[name])
            for name, code in STEP_TYPECODES.items()
        }
        log._num_steps_stored = len(log._steps["step_id"])
        delivered = exported["delivered"]
        log._delivered_step = array("q", delivered["step_id"])
        log._delivered_time = array("d", delivered["time_s"])
        groups = (
            (log._ev_req, log._ev_kind, log._ev_time, log._ev_payload),
            (log._run_req, log._run_first, log._run_count),
            tuple(log._steps.values()),
            (log._delivered_step, log._delivered_time),
        )
        if any(len({len(column) for column in group}) > 1 for group in groups):
            raise ValueError("exported columns of unequal lengths")
        return log

    def iter_events(self, expand_tokens: bool = True) -> Iterator[RequestEvent]:
        """All events in time order, token runs expanded into TOKEN events. At one time,
        recorded events keep their recording order and TOKEN events come in the order of
        their requests' first appearance in the log (so a log reads the same whether its
        steps were applied one by one or in bulk)."""
        self._flush_events()
        events = [
            RequestEvent(self.req_ids[r], EventKind(k), t, p)
            for r, k, t, p in zip(
                self._ev_req, self._ev_kind, self._ev_time, self._ev_payload, strict=True
            )
        ]
        if expand_tokens:
            steps = self._stored_steps()
            step_ids, update_times = steps["step_id"], steps["update_time_s"]
            time_of = dict(zip(step_ids, update_times, strict=True))
            runs = self.token_runs()
            # Runs are stored in the order they were closed, which depends on how the steps
            # were applied (one by one or in bulk); the events of one step follow the
            # requests' order of first appearance instead, whatever the storage order.
            for r, f, c in sorted(
                zip(runs["req_index"], runs["first_step"], runs["num_tokens"], strict=True)
            ):
                for s in range(f, f + c):
                    events.append(
                        RequestEvent(
                            self.req_ids[r], EventKind.TOKEN, float(time_of[s]), s  # type: ignore[arg-type]
                        )
                    )
        events.sort(key=lambda e: (e.time_s, e.kind))
        return iter(events)


def _grow(column: array[Any] | list[Any], size: int) -> None:
    """Lengthen ``column`` to ``size`` rows with placeholders (zeros, or "" in the string
    column), overwritten as steps are appended."""
    missing = size - len(column)
    if isinstance(column, list):
        column.extend([""] * missing)
    else:
        column.frombytes(bytes(missing * column.itemsize))
