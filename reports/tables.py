"""The event log as three tables: one row per request, per engine step, per token run.

``build_columns(log)`` is the only place that reads an ``EventLog``: it builds the tables as
numpy columns (``reports.columns.RunColumns``), which the summary reads and a run directory
stores; ``build_tables(log)`` gives them as pandas DataFrames (``RunTables``), as a run
directory loads them back, so a report rebuilt from files equals the one written at the end of
the run.

Invariants (each checked by tests):

* ``requests`` has one row per request, row ``i`` is ``req_index`` ``i``; a stage time is NaN
  when the log has no such event; token times are *client* times: the token of step ``s`` is
  delivered at ``steps.delivered_time_s[s]``;
* ``ttft_s``/``e2el_s`` are the first/last token's delivery time minus the send time
  (METRICS.md §1), ``tpot_s`` is NaN for requests with ≤ 1 output token;
* the ``seg_*`` columns (``breakdown.SEGMENTS``) are consecutive and sum to ``ttft_s`` (TTFT
  path) and ``e2el_s`` (E2EL path) for every successful request;
* ``steps`` is sorted by ``step_id``; ``token_runs`` is sorted by (``req_index``,
  ``first_step``);
* ``tenant`` and ``slo_class`` (categorical, "" for a request without one) are columns only when
  the log has labels (a workload with tenants or SLO classes).

Everything is vectorised over requests and steps: a million requests build in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.events import STEP_COLUMNS, EventKind, EventLog
from reports.breakdown import segment_columns
from reports.columns import Column, ColumnTable, Labels, OptionalInts, RunColumns

# Re-exported: the DataFrame tables are built here (``build_tables``), as they always were.
from reports.columns import RunTables as RunTables

#: Finish reasons that count as a successful request (vllm bench: the stream completed).
SUCCESS_REASONS: frozenset[str] = frozenset({"stop", "length", "repetition"})

#: Stage events stored as one time column each (first occurrence in time).
STAGE_COLUMNS: dict[str, EventKind] = {
    "arrival_s": EventKind.ARRIVAL,
    "frontend_start_s": EventKind.FRONTEND_START,
    "tokenized_s": EventKind.TOKENIZED,
    "engine_enqueued_s": EventKind.ENGINE_ENQUEUED,
    "scheduled_s": EventKind.SCHEDULED,  # first admission
    "first_token_s": EventKind.FIRST_TOKEN,  # engine-side
    "finished_s": EventKind.FINISHED,
    "delivered_s": EventKind.DELIVERED,
    "rejected_s": EventKind.REJECTED,
}


class ExportedLog:
    """An ``EventLog.export()`` read back (in a report process): the log's read side. Its typed
    columns are ``array``s, or read-only numpy arrays where the report process mapped them.

    With ``owned=True`` the export is this reader's alone (a report process's copy, or
    ``EventLog.take_export()``): each part is handed out once and dropped from the export, and
    the tables may keep its typed columns as their own, so a large log is freed while its
    tables are built instead of held beside them."""

    def __init__(self, exported: dict[str, Any], owned: bool = False) -> None:
        self.req_ids: list[str] = exported["req_ids"]
        self.owned = owned
        self._exported = exported

    def _part(self, key: str) -> Any:
        return self._exported.pop(key) if self.owned else self._exported[key]

    def events_columns(self) -> dict[str, object]:
        return self._part("events")  # type: ignore[no-any-return]

    def token_runs(self) -> dict[str, Any]:
        return self._part("token_runs")  # type: ignore[no-any-return]

    def steps_columns(self) -> dict[str, object]:
        return self._part("steps")  # type: ignore[no-any-return]

    def delivered_columns(self) -> dict[str, Any]:
        return self._part("delivered")  # type: ignore[no-any-return]

    def labels_columns(self) -> dict[str, Any]:
        labels = self._exported.pop("labels", None) if self.owned else self._exported.get(
            "labels")
        return labels or {"req_index": [], "tenant": [], "slo_class": []}

    def take_req_ids(self) -> list[str]:
        """The request ids (an owned export lets go of them: the table keeps its own)."""
        req_ids = self.req_ids
        if self.owned:
            self.req_ids = []
            self._exported.pop("req_ids", None)
        return req_ids


#: What the tables are built from: the log itself, or its export.
RunLog = EventLog | ExportedLog


@dataclass(frozen=True, slots=True)
class _Events:
    """The stage events as numpy columns."""

    req: np.ndarray  # req_index (int32 in a log, int64 from a list)
    kind: np.ndarray  # int8 EventKind
    time_s: np.ndarray  # float64
    payload: list[int | str | None]


def build_columns(log: RunLog) -> RunColumns:
    """The three tables of ``log`` as columns (copies: the log may keep growing afterwards)."""
    steps = build_steps(log)
    runs = build_token_runs(log)
    requests = build_requests(log, steps, runs)
    return RunColumns(requests, steps, runs)


def take_columns(log: RunLog) -> RunColumns:
    """``build_columns`` for a log its caller is done with: an ``EventLog``'s storage is moved
    out (``take_export``: the log is left empty) and freed part by part as the tables are
    built, so that a long run's log and its tables are never held whole together."""
    if isinstance(log, EventLog):
        return build_columns(ExportedLog(log.take_export(), owned=True))
    return build_columns(log)


def build_tables(log: RunLog) -> RunTables:
    """The three tables of ``log`` as DataFrames (``build_columns``, converted)."""
    return build_columns(log).to_frames()


def build_steps(log: RunLog) -> ColumnTable:
    """One row per step, sorted by ``step_id``, with ``delivered_time_s`` (NaN: no outputs)."""
    cols = log.steps_columns()
    owned = isinstance(log, ExportedLog) and log.owned  # its typed columns may become ours
    data: dict[str, Column] = {}
    for name in STEP_COLUMNS:
        col = cols.pop(name) if owned else cols[name]  # type: ignore[attr-defined]
        if name == "admission_blocker":
            data[name] = Labels.sorted_from(col)  # type: ignore[arg-type]
        else:  # the log's compact types (a mapped column's own; a list's as floats)
            dtype = col.dtype if isinstance(col, np.ndarray) else np.dtype(
                getattr(col, "typecode", "d"))
            data[name] = _view_array(col, dtype) if owned else _copy_array(col, dtype)
        del col
    step_ids = data["step_id"]
    assert isinstance(step_ids, np.ndarray)
    if len(step_ids) > 1 and not (step_ids[1:] >= step_ids[:-1]).all():
        order = np.argsort(step_ids, kind="stable")
        data = dict(ColumnTable(data).take(order).columns)
        step_ids = step_ids[order]
    delivered = log.delivered_columns()
    ids = np.asarray(delivered["step_id"], dtype=np.int64)
    times = np.asarray(delivered["time_s"], dtype=np.float64)
    data["delivered_time_s"] = _by_step(step_ids, ids, times)
    return ColumnTable(data)


def _by_step(step_ids: np.ndarray, ids: np.ndarray, times: np.ndarray) -> np.ndarray:
    """``times`` (of steps ``ids``) aligned to the sorted, unique ``step_ids``; NaN where a
    step has none. A step delivered twice is an error (as a pandas reindex would raise)."""
    out = np.full(len(step_ids), np.nan)
    if not ids.size or not step_ids.size:
        return out
    pos = np.searchsorted(step_ids, ids)
    inside = pos < step_ids.size
    found = inside.copy()
    found[inside] = step_ids[pos[inside]] == ids[inside]
    pos, hit_times = pos[found], times[found]
    if pos.size and np.bincount(pos).max() > 1:
        raise ValueError("a step was delivered twice")
    out[pos] = hit_times
    return out


def build_token_runs(log: RunLog) -> ColumnTable:
    """Token runs sorted by (req_index, first_step)."""
    runs = log.token_runs()
    req = _copy_array(runs["req_index"], np.int64)
    first = _copy_array(runs["first_step"], np.int64)
    count = _copy_array(runs["num_tokens"], np.int64)
    order = np.lexsort((first, req))
    return ColumnTable(
        {"req_index": req[order], "first_step": first[order], "num_tokens": count[order]})


def step_lookup(steps: ColumnTable, column: str) -> np.ndarray:
    """``column`` as a dense array indexed by step_id (NaN where no such step)."""
    ids = steps.array("step_id")
    size = int(ids.max()) + 1 if len(ids) else 0
    out = np.full(size, np.nan)
    out[ids] = steps.array(column, np.float64)
    return out


def build_requests(log: RunLog, steps: ColumnTable, runs: ColumnTable) -> ColumnTable:
    """One row per request: stage times, token counts, derived metrics, breakdown segments."""
    n = len(log.req_ids)
    # the log is read first (an owned export is freed as it is read), then the tables
    req_ids = log.take_req_ids() if isinstance(log, ExportedLog) else log.req_ids
    req_id = np.empty(n, dtype=object)
    req_id[:] = req_ids
    del req_ids
    per_event = _event_columns(log, n)
    times = {name: per_event.pop(name) for name in STAGE_COLUMNS}
    tokens = _token_columns(steps, runs, n)
    finish: Labels = per_event["finish_reason"]
    success = (
        np.isin(finish.codes, [finish.code_of(r) for r in sorted(SUCCESS_REASONS)])
        & np.isnan(times["rejected_s"])
        & (tokens["num_output_tokens"] > 0)
    )
    cols: dict[str, Column] = {
        "req_index": np.arange(n, dtype=np.int64),
        "req_id": req_id,
        "success": success,
        "finish_reason": finish,
        "rejected_reason": per_event["rejected_reason"],
        "num_prompt_tokens": per_event["num_prompt_tokens"],
        "num_output_tokens": tokens["num_output_tokens"],
        "num_preemptions": per_event["num_preemptions"],
        "num_schedules": per_event["num_schedules"],
        "prefix_hit_tokens": per_event["prefix_hit_tokens"],
    }
    del per_event
    cols.update(times)
    if "replica" in steps:  # data-parallel engines: the one that produced the tokens
        cols["replica"] = OptionalInts(tokens["replica"])
    cols.update(_label_columns(log, n))
    cols["last_token_s"] = tokens["last_token_s"]
    cols["first_token_delivered_s"] = tokens["first_token_delivered_s"]
    cols["last_token_delivered_s"] = tokens["last_token_delivered_s"]
    cols.update(_derived(cols, tokens["num_output_tokens"]))
    cols.update(segment_columns(cols, steps))
    return ColumnTable(cols)


def _event_columns(log: RunLog, n: int) -> dict[str, Any]:
    """The request columns read from the stage events: stage times, finish and rejection
    reasons, prompt tokens, preemptions, schedules, prefix hits (the events are let go of on
    return)."""
    ev = _events(log)
    out: dict[str, Any] = {name: _first_time(ev, kind, n) for name, kind in STAGE_COLUMNS.items()}
    out["finish_reason"] = _reason_column(ev, EventKind.FINISHED, n)
    out["rejected_reason"] = _reason_column(ev, EventKind.REJECTED, n)
    out["num_prompt_tokens"] = _int_payload(ev, EventKind.ARRIVAL, n)
    out["num_preemptions"] = _count(ev, EventKind.PREEMPTED, n)
    out["num_schedules"] = _count(ev, EventKind.SCHEDULED, n)
    out["prefix_hit_tokens"] = _first_admission_payload(ev, n)
    return out


def _derived(cols: dict[str, Column], num_output: np.ndarray) -> dict[str, np.ndarray]:
    """TTFT, TPOT, E2EL (client side) and vLLM's engine-side request intervals."""
    c = {k: v for k, v in cols.items() if k.endswith("_s") and isinstance(v, np.ndarray)}
    ttft = c["first_token_delivered_s"] - c["arrival_s"]
    e2el = c["last_token_delivered_s"] - c["arrival_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(num_output > 1, (e2el - ttft) / (num_output - 1), np.nan)
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2el_s": e2el,
        "queue_time_s": c["scheduled_s"] - c["engine_enqueued_s"],
        "prefill_time_s": c["first_token_s"] - c["scheduled_s"],
        "decode_time_s": c["last_token_s"] - c["first_token_s"],
        "inference_time_s": c["last_token_s"] - c["scheduled_s"],
    }


def _token_columns(steps: ColumnTable, runs: ColumnTable, n: int) -> dict[str, np.ndarray]:
    """Per request: output tokens, engine time of the last token, first/last delivery times,
    and the replica (data-parallel engine) whose step produced the first token."""
    req = runs.array("req_index")
    first = runs.array("first_step")
    last = first + runs.array("num_tokens") - 1
    num_output = np.bincount(req, weights=runs.array("num_tokens"), minlength=n)
    num_output = num_output.astype(np.int64)
    has = num_output > 0
    first_step = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first_step, req, first)
    last_step = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_step, req, last)
    first_step[~has] = 0
    last_step[~has] = 0
    delivered = step_lookup(steps, "delivered_time_s")
    update = step_lookup(steps, "update_time_s")
    nan = np.full(n, np.nan)
    if len(delivered) == 0:
        return {
            "num_output_tokens": num_output, "last_token_s": nan,
            "first_token_delivered_s": nan, "last_token_delivered_s": nan, "replica": nan,
        }
    replica = nan
    if "replica" in steps:
        replica = np.where(has, step_lookup(steps, "replica")[first_step], np.nan)
    return {
        "replica": replica,
        "num_output_tokens": num_output,
        "last_token_s": np.where(has, update[last_step], np.nan),
        "first_token_delivered_s": np.where(has, delivered[first_step], np.nan),
        "last_token_delivered_s": np.where(has, delivered[last_step], np.nan),
    }


def _label_columns(log: RunLog, n: int) -> dict[str, Labels]:
    """``tenant`` and ``slo_class`` per request ("" where none), if the log has labels."""
    labels = log.labels_columns()
    idx = np.asarray(labels["req_index"], dtype=np.int64)
    if not idx.size:
        return {}
    out = {}
    for name in ("tenant", "slo_class"):
        values = np.full(n, "", dtype=object)
        values[idx] = labels[name]
        out[name] = Labels.sorted_from(values.tolist())
    return out


# -- event columns --------------------------------------------------------------------------------
def _copy_array(col: Any, dtype: type | np.dtype[Any]) -> np.ndarray:
    """A numpy copy of a typed ``array.array`` (or numpy array, or list) column."""
    if hasattr(col, "typecode"):
        raw = np.frombuffer(col, dtype=np.dtype(col.typecode)) if len(col) else np.zeros(0)
        return raw.astype(dtype, copy=True)
    return np.asarray(col, dtype=dtype).copy()


def _view_array(col: Any, dtype: type | np.dtype[Any]) -> np.ndarray:
    """A typed ``array.array`` column as a numpy view of its buffer (no copy), a numpy array
    (a report process's mapped column) as it is, or a list as a new array of ``dtype``. Views
    live only while the tables are built: an ``array`` with a view cannot grow, and the log
    may keep growing afterwards."""
    if isinstance(col, np.ndarray):
        return col
    if hasattr(col, "typecode") and len(col):
        view = np.frombuffer(col, dtype=np.dtype(col.typecode))
        view.flags.writeable = False  # the log's own storage
        return view
    return np.asarray(col, dtype=dtype)


def _events(log: RunLog) -> _Events:
    """The stage events, viewed in place (req_index int32, kind int8: the log's own types,
    which index and compare as the int64 copies did, without ≈ 17 bytes an event of copies)."""
    ev = log.events_columns()
    return _Events(
        _view_array(ev["req_index"], np.int64),
        _view_array(ev["kind"], np.int8),
        _view_array(ev["time_s"], np.float64),
        ev["payload"],  # type: ignore[arg-type]
    )


def _first_time(ev: _Events, kind: EventKind, n: int) -> np.ndarray:
    """Per request, the earliest time of ``kind`` (NaN if none)."""
    mask = ev.kind == int(kind)
    out = np.full(n, np.inf)
    np.minimum.at(out, ev.req[mask], ev.time_s[mask])
    out[np.isinf(out)] = np.nan
    return out


def _count(ev: _Events, kind: EventKind, n: int) -> np.ndarray:
    return np.bincount(ev.req[ev.kind == int(kind)], minlength=n).astype(np.int64)


def _payloads(ev: _Events, idx: np.ndarray) -> list[int | str | None]:
    payload = ev.payload
    return [payload[i] for i in idx.tolist()]


def _ints(values: list[int | str | None]) -> np.ndarray:
    """Integer payloads as int64 (anything not an int counts as 0)."""
    try:
        return np.array(values, dtype=np.int64).reshape(len(values))
    except (TypeError, ValueError):
        return np.fromiter(
            (v if isinstance(v, int) else 0 for v in values), np.int64, len(values)
        )


def _int_payload(ev: _Events, kind: EventKind, n: int) -> np.ndarray:
    """The integer payload of ``kind`` per request (0 where absent)."""
    idx = np.flatnonzero(ev.kind == int(kind))
    out = np.zeros(n, dtype=np.int64)
    out[ev.req[idx]] = _ints(_payloads(ev, idx))
    return out


def _first_admission_payload(ev: _Events, n: int) -> np.ndarray:
    """Prefix-cache hit tokens at each request's first SCHEDULED event (0 if never)."""
    idx = np.flatnonzero(ev.kind == int(EventKind.SCHEDULED))
    order = np.lexsort((ev.time_s[idx], ev.req[idx]))
    idx = idx[order]
    _, first = np.unique(ev.req[idx], return_index=True)
    idx = idx[first]
    out = np.zeros(n, dtype=np.int64)
    out[ev.req[idx]] = _ints(_payloads(ev, idx))
    return out


def _reason_column(ev: _Events, kind: EventKind, n: int) -> Labels:
    """The string payload of ``kind`` per request as labels (missing where absent), its
    categories in order of first appearance."""
    idx = np.flatnonzero(ev.kind == int(kind))
    reasons = Labels.in_order_of_appearance(_payloads(ev, idx))
    full = np.full(n, -1, dtype=np.int64)
    full[ev.req[idx]] = reasons.codes
    return Labels(full, reasons.categories, "object")
