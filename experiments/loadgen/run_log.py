"""A benchmark's event log: the client's times, joined with the server's stage records.

Both functions return the export format of one ``EventLog`` (``reports.tables.ExportedLog``),
time 0 = the first request the client sent, requests named by the client's ids in send order:

* ``client_log`` — the client alone (any OpenAI-compatible server). Each request has its send
  (``ARRIVAL``), its end (``FINISHED`` with the finish reason of its last chunk, or
  ``REJECTED`` with the error of a request that got no content) and ``DELIVERED`` at its last
  chunk. There are no engine steps to tell: each output token is a *step* of its own at the
  time its chunk arrived (a chunk's tokens: one each, except that the last chunk carries what
  the usage count says is left — or the counts of continuous usage stats when the server sent
  them), so TTFT, TPOT and E2EL of the run directory are the client's.
* ``joined_log`` — the same requests joined with a ``twinserve serve --record-dir`` run's
  records: the API servers' and the EngineCore's stage events (front end, IPC, scheduling,
  tokens, finish), the engine's own steps, and the client's send and last receive in place of
  the server's ``ARRIVAL``/``DELIVERED``. A step is delivered when the last of its tokens that
  this run's requests received reached the client (the server's convention for a step written
  to several clients). Client and server share ``CLOCK_MONOTONIC`` on one host (the API
  servers record the run clock's origin); otherwise the offset is estimated as the one that
  makes the fastest request's network time zero.

``served_tables`` keeps what only a server has (the engine's receive time per request, the
output handler's time per step) on the same timeline, for this run's requests.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine.core.events import STEP_COLUMNS, EventKind, StepRecord
from experiments.loadgen.client import RequestOutput
from experiments.loadgen.inputs import BenchRequest

#: Step columns that hold integers.
_INT_COLUMNS = frozenset(f.name for f in fields(StepRecord) if f.type in ("int", int))
#: A request's finish when its last chunk named none (the stream ended at max_tokens or EOS).
DEFAULT_FINISH = "length"


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """What the client knows of one request (``client_requests`` table of a run directory)."""

    request: BenchRequest
    output: RequestOutput
    chunk_tokens: list[int]  # tokens each content chunk carried (see ``tokens_per_chunk``)


def tokens_per_chunk(out: RequestOutput, cumulative: Sequence[int] | None = None) -> list[int]:
    """Tokens per content chunk: from continuous usage counts when given, else one each and
    the rest of the usage count on the last chunk."""
    n = len(out.chunk_times)
    if n == 0:
        return []
    if cumulative is not None and len(cumulative) == n and all(
            b >= a for a, b in zip([0, *cumulative], cumulative, strict=False)):
        counts = np.diff([0, *cumulative]).tolist()
        if all(c >= 1 for c in counts):
            return [int(c) for c in counts]
    counts = [1] * n
    counts[-1] += max(out.output_tokens - n, 0)
    return counts


class _LogBuilder:
    """Collects an export-format log (events, token runs, steps, deliveries)."""

    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids
        self.events: dict[str, list[Any]] = {"req_index": [], "kind": [], "time_s": [],
                                             "payload": []}
        self.runs: dict[str, list[int]] = {"req_index": [], "first_step": [], "num_tokens": []}
        self.steps: dict[str, list[Any]] = {name: [] for name in STEP_COLUMNS}
        self.delivered: dict[str, list[Any]] = {"step_id": [], "time_s": []}

    def event(self, req: int, kind: EventKind, time_s: float, payload: Any = None) -> None:
        e = self.events
        e["req_index"].append(req)
        e["kind"].append(int(kind))
        e["time_s"].append(float(time_s))
        e["payload"].append(payload)

    def export(self) -> dict[str, Any]:
        """The export format; step columns typed as the engine's log types them (integer
        columns as ``array("q")``, times as ``array("d")``), which the tables keep."""
        steps: dict[str, Any] = {}
        for name, values in self.steps.items():
            if name == "admission_blocker":
                steps[name] = list(values)
            else:
                steps[name] = array("q" if name in _INT_COLUMNS else "d", values)
        return {"req_ids": self.req_ids, "events": self.events, "token_runs": self.runs,
                "steps": steps, "delivered": self.delivered}


def _client_events(b: _LogBuilder, i: int, c: ClientRequest, t0: float,
                   with_finish: bool) -> None:
    out = c.output
    b.event(i, EventKind.ARRIVAL, out.start_time - t0, c.request.prompt_len
            if not out.success else out.prompt_len)
    if not out.chunk_times:
        b.event(i, EventKind.REJECTED, out.start_time + out.latency - t0,
                out.error or "no content")
        return
    last = out.chunk_times[-1] - t0
    if with_finish:
        reason = "error" if out.error else (out.finish_reason or DEFAULT_FINISH)
        b.event(i, EventKind.FINISHED, last, reason)
    b.event(i, EventKind.DELIVERED, last)


def client_log(requests: Sequence[ClientRequest]) -> dict[str, Any]:
    """The client-only log (see the module docstring)."""
    t0 = min(c.output.start_time for c in requests)
    b = _LogBuilder([c.request.request_id for c in requests])
    tokens: list[tuple[float, int, int, int]] = []  # (time, request, chunk, tokens)
    for i, c in enumerate(requests):
        _client_events(b, i, c, t0, with_finish=True)
        for k, (t, n) in enumerate(zip(c.output.chunk_times, c.chunk_tokens, strict=True)):
            tokens.append((t - t0, i, k, n))
    tokens.sort()
    step = 0
    seen: set[int] = set()
    last_chunk = {i: len(c.chunk_tokens) - 1 for i, c in enumerate(requests)}
    for t, i, k, n in tokens:
        b.runs["req_index"].append(i)
        b.runs["first_step"].append(step)
        b.runs["num_tokens"].append(n)
        for j in range(n):
            first = i not in seen
            seen.add(i)
            finished = k == last_chunk[i] and j == n - 1
            _client_step(b.steps, step, t, first, finished)
            b.delivered["step_id"].append(step)
            b.delivered["time_s"].append(t)
            step += 1
    return b.export()


def _client_step(steps: dict[str, list[Any]], step_id: int, t: float, first: bool,
                 finished: bool) -> None:
    """A token as a step of its own: one request, one sampled token, no engine state."""
    row: dict[str, Any] = dict.fromkeys(STEP_COLUMNS, 0)
    row.update(step_id=step_id, schedule_time_s=t, execute_start_s=t, execute_end_s=t,
               update_time_s=t, num_reqs=1, num_tokens=1, num_decode_reqs=1,
               num_sampled_tokens=1, num_new_reqs=int(first), num_finished_reqs=int(finished),
               kv_usage=0.0, admission_blocker="", cost_s=0.0)
    for name in STEP_COLUMNS:
        steps[name].append(row[name])


# -- joined with the server's records ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Alignment:
    """Client clock -> the joined server log's clock: ``t_server = t_client - offset_s``."""

    offset_s: float
    source: str  # "shared clock" or "estimated"


def align(requests: Sequence[ClientRequest], internal: dict[str, str],
          server_arrival: dict[str, float], clock_origin_s: float | None,
          log_origin_s: float) -> Alignment:
    """How client times map onto the server log (see the module docstring). A shared clock is
    used when the API servers recorded the run clock's origin and every request then reaches
    the server after the client sent it, by less than a minute."""
    sends = [(c.output.start_time, server_arrival[internal[c.request.request_id]])
             for c in requests
             if c.request.request_id in internal
             and internal[c.request.request_id] in server_arrival]
    if clock_origin_s is not None:
        offset = clock_origin_s + log_origin_s
        gaps = [arrival - (send - offset) for send, arrival in sends]
        if gaps and min(gaps) >= -1e-3 and max(gaps) < 60.0:
            return Alignment(offset, "shared clock")
    if not sends:
        return Alignment(0.0, "none")
    return Alignment(max(send - arrival for send, arrival in sends), "estimated")


def _token_steps(b: _LogBuilder) -> dict[int, list[int]]:
    """Each request's token steps, in order (from the token runs kept for this run)."""
    out: dict[int, list[int]] = {}
    runs = b.runs
    for r, first, n in zip(runs["req_index"], runs["first_step"], runs["num_tokens"],
                           strict=True):
        out.setdefault(r, []).extend(range(first, first + n))
    return {r: sorted(steps) for r, steps in out.items()}


def _chunk_of_tokens(c: ClientRequest, num_tokens: int) -> list[int]:
    """Index of the chunk that carried each of the request's ``num_tokens`` tokens."""
    counts = list(c.chunk_tokens)
    if not counts:
        return []
    total = sum(counts)
    if total != num_tokens:  # the client's count disagrees: last chunk takes the difference
        counts[-1] = max(counts[-1] + num_tokens - total, 0)
    out: list[int] = []
    for k, n in enumerate(counts):
        out.extend([k] * n)
    return out[:num_tokens] + [len(counts) - 1] * max(num_tokens - len(out), 0)


def joined_log(requests: Sequence[ClientRequest], joined: dict[str, Any],
               internal: dict[str, str], alignment: Alignment) -> dict[str, Any]:
    """This run's requests and the engine steps during it (see the module docstring).
    ``joined`` is the whole server's log (``experiments.serve.run_dir.joined_log``),
    ``internal`` maps the client's request id to the server's."""
    t0 = min(c.output.start_time for c in requests)
    shift = alignment.offset_s - t0  # server time + shift = run time (0 = first send)
    index_of = {r: i for i, r in enumerate(joined["req_ids"])}
    b = _LogBuilder([c.request.request_id for c in requests])
    new_index = {index_of[internal[c.request.request_id]]: i for i, c in enumerate(requests)
                 if internal.get(c.request.request_id) in index_of}
    ev = joined["events"]
    for r, k, t, p in zip(ev["req_index"], ev["kind"], ev["time_s"], ev["payload"],
                          strict=True):
        i = new_index.get(int(r))
        if i is not None and k not in (EventKind.ARRIVAL, EventKind.DELIVERED):
            b.event(i, EventKind(k), float(t) + shift, p)
    server_seen = set(new_index.values())
    for i, c in enumerate(requests):
        _client_events(b, i, c, t0, with_finish=i not in server_seen)
    runs = joined["token_runs"]
    for r, first, n in zip(runs["req_index"], runs["first_step"], runs["num_tokens"],
                           strict=True):
        i = new_index.get(int(r))
        if i is not None:
            b.runs["req_index"].append(i)
            b.runs["first_step"].append(int(first))
            b.runs["num_tokens"].append(int(n))
    _window_steps(b, joined, requests, t0, shift)
    _client_deliveries(b, requests, t0)
    return b.export()


def _window_steps(b: _LogBuilder, joined: dict[str, Any], requests: Sequence[ClientRequest],
                  t0: float, shift: float) -> None:
    """The engine steps scheduled while this run was in flight, and every step that produced
    a token of it."""
    steps = joined["steps"]
    begin = min(c.output.start_time for c in requests) - t0
    end = max(c.output.start_time + c.output.latency for c in requests) - t0
    wanted = {s for i in range(len(b.runs["req_index"]))
              for s in range(b.runs["first_step"][i],
                             b.runs["first_step"][i] + b.runs["num_tokens"][i])}
    times = {"schedule_time_s", "execute_start_s", "execute_end_s", "update_time_s"}
    for j, step_id in enumerate(steps["step_id"]):
        at = float(steps["schedule_time_s"][j]) + shift
        if not (begin <= at <= end or int(step_id) in wanted):
            continue
        for name in STEP_COLUMNS:
            value = steps[name][j]
            b.steps[name].append(float(value) + shift if name in times else value)


def _client_deliveries(b: _LogBuilder, requests: Sequence[ClientRequest], t0: float) -> None:
    """Per step, the latest client receipt of the chunks that carried its tokens."""
    delivered: dict[int, float] = {}
    for i, token_steps in _token_steps(b).items():
        c = requests[i]
        if not c.output.chunk_times:
            continue
        for step, k in zip(token_steps, _chunk_of_tokens(c, len(token_steps)), strict=True):
            t = c.output.chunk_times[k] - t0
            if delivered.get(step, -np.inf) < t:
                delivered[step] = t
    for step in sorted(delivered):
        b.delivered["step_id"].append(step)
        b.delivered["time_s"].append(delivered[step])
