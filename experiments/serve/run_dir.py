"""A served run's directory: the stage records of every server process joined into one log.

``twinserve serve --record-dir DIR`` leaves, at shutdown, each process's records in
``DIR/records/`` (``engine.entrypoints.records``). They are on one clock already; this module
joins them into the export format of one ``EventLog`` (``reports.tables.ExportedLog``) and
writes the run directory ``twinserve report`` reads, like a simulated or ``run-real`` one:

* requests are numbered in order of arrival at the API servers;
* the API servers' stage events (arrival, front end, tokenized, delivered, rejected) and the
  engine's (enqueued, scheduled, preempted, first token, finished) become one event table;
* token runs and steps are the engine's; a step's delivery time is when the last of its
  tokens was written to a client, over all API servers;
* time 0 is the first request's arrival.

``served_tables`` adds what only a server has (the engine's receive time of each request, the
output handler's time per step, the clients' own request ids) as ``served_requests`` and
``served_steps`` tables beside the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.errors import UserError
from engine.core.events import EventKind
from engine.entrypoints.records import (
    API_RECORD_NAME,
    ENGINE_RECORD_NAME,
    APIServerRecord,
    EngineRecord,
    read_pickle,
)

#: Step columns that hold times on the run's clock.
STEP_TIME_COLUMNS = ("schedule_time_s", "execute_start_s", "execute_end_s", "update_time_s")


@dataclass(frozen=True, slots=True)
class ServedRecords:
    """What a served run left in its record directory."""

    engine: EngineRecord
    api_servers: list[APIServerRecord]


def read_records(record_dir: Path, api_server_count: int) -> ServedRecords:
    """The records of one engine and ``api_server_count`` API servers."""
    engine_path = record_dir / ENGINE_RECORD_NAME.format(index=0)
    if not engine_path.exists():
        raise UserError(f"{engine_path} is missing: the EngineCore did not shut down cleanly, "
                        "so no run directory was written")
    apis = []
    for i in range(api_server_count):
        path = record_dir / API_RECORD_NAME.format(index=i)
        if not path.exists():
            raise UserError(f"{path} is missing: API server {i} did not shut down cleanly, "
                            "so no run directory was written")
        apis.append(read_pickle(path))
    return ServedRecords(read_pickle(engine_path), apis)


def joined_log(records: ServedRecords) -> dict[str, Any]:
    """One ``EventLog.export()``-shaped dict for the whole server (see the module doc)."""
    engine = records.engine.log
    api_events = [
        (r, k, t, p)
        for rec in records.api_servers
        for r, k, t, p in zip(rec.req_ids, rec.kinds, rec.times_s, rec.payloads, strict=True)
    ]
    arrival = {r: t for r, k, t, _ in api_events if k == EventKind.ARRIVAL}
    engine_ids: list[str] = engine["req_ids"]
    late = float("inf")
    req_ids = sorted(dict.fromkeys([*arrival, *engine_ids]),
                     key=lambda r: (arrival.get(r, late), r))
    index = {r: i for i, r in enumerate(req_ids)}
    origin = _origin(records)

    ev = engine["events"]
    engine_req = [index[engine_ids[i]] for i in ev["req_index"]]
    events = {
        "req_index": [index[r] for r, _, _, _ in api_events] + engine_req,
        "kind": [k for _, k, _, _ in api_events] + list(ev["kind"]),
        "time_s": (np.array([t for _, _, t, _ in api_events] + list(ev["time_s"]),
                            dtype=np.float64) - origin).tolist(),
        "payload": [p for _, _, _, p in api_events] + list(ev["payload"]),
    }
    runs = engine["token_runs"]
    token_runs = {
        "req_index": [index[engine_ids[i]] for i in runs["req_index"]],
        "first_step": list(runs["first_step"]),
        "num_tokens": list(runs["num_tokens"]),
    }
    steps = dict(engine["steps"])
    for name in STEP_TIME_COLUMNS:
        steps[name] = (np.asarray(steps[name], dtype=np.float64) - origin).tolist()
    delivered: dict[int, float] = {}
    for rec in records.api_servers:
        for (engine_index, step_id), t in rec.step_delivered_s.items():
            if engine_index == records.engine.engine_index and delivered.get(step_id, -1.0) < t:
                delivered[step_id] = t
    step_ids = sorted(delivered)
    return {
        "req_ids": req_ids,
        "events": events,
        "token_runs": token_runs,
        "steps": steps,
        "delivered": {
            "step_id": step_ids,
            "time_s": [delivered[s] - origin for s in step_ids],
        },
    }


def served_tables(records: ServedRecords, joined: dict[str, Any]) -> tuple[Any, Any]:
    """The stages only a server has, on the run's timeline (time 0 = first arrival):

    * per request (``req_index`` as in the requests table): the client's own id
      (``X-Request-Id``), the API server that took it, when the engine's input thread received
      it (``engine_received_s``; IPC in is ``tokenized_s`` → this, the busy loop's pickup is
      this → ``engine_enqueued_s``);
    * per step and API server: when its output handler had processed the step's outputs
      (``processed_s``) and when the step's last token was written to a client
      (``delivered_s``).
    """
    import pandas as pd

    origin = _origin(records)
    server_of = {r: rec.client_index for rec in records.api_servers for r in set(rec.req_ids)}
    ids = external_ids(records)
    received = records.engine.received_s
    req_ids = joined["req_ids"]
    requests = pd.DataFrame({
        "req_index": range(len(req_ids)),
        "req_id": req_ids,
        "client_request_id": [ids.get(r) for r in req_ids],
        "api_server": pd.array([server_of.get(r) for r in req_ids], dtype="Int64"),
        "engine_received_s": [received[r] - origin if r in received else float("nan")
                              for r in req_ids],
    })
    rows = []
    engine = records.engine.engine_index
    for rec in records.api_servers:
        keys = set(rec.step_processed_s) | set(rec.step_delivered_s)
        for e, step in sorted(keys):
            if e != engine:
                continue
            rows.append((step, rec.client_index,
                         rec.step_processed_s.get((e, step), float("nan")) - origin,
                         rec.step_delivered_s.get((e, step), float("nan")) - origin))
    steps = pd.DataFrame(rows, columns=["step_id", "api_server", "processed_s", "delivered_s"])
    return requests, steps


def _origin(records: ServedRecords) -> float:
    arrivals = [t for rec in records.api_servers
                for k, t in zip(rec.kinds, rec.times_s, strict=True) if k == EventKind.ARRIVAL]
    return min(arrivals, default=0.0)


def external_ids(records: ServedRecords) -> dict[str, str]:
    """Each request's id as its client gave it (``X-Request-Id``) or as the server made it."""
    out: dict[str, str] = {}
    for rec in records.api_servers:
        out.update(rec.external_ids)
    return out
