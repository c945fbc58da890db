"""Stage records of a running server, written by each process at shutdown.

Each process records the events of the request path it sees, on the run's clock
(``engine.entrypoints.clock``), with the kinds of ``engine.core.events.EventKind``:

* an API server: ``ARRIVAL`` (the HTTP request was received; payload: prompt tokens),
  ``FRONTEND_START`` (its handler started validating), ``TOKENIZED`` (template, tokenization
  and validation done: sent to the engine), ``DELIVERED`` (the request's last token reached
  the client's connection), ``REJECTED`` (refused with a 4xx; payload: the message); per engine
  step, when its output handler had processed the step's outputs and when the step's tokens
  were written to the clients (the last of its requests);
* the EngineCore: its core's ``EventLog`` (enqueued, scheduled, preempted, tokens, finished,
  one record per step), exactly as every other driver writes it, and when its input thread
  received each request (so IPC in and the busy loop's pickup can be told apart).

``APIServerRecord`` and ``EngineRecord`` are what the processes leave in the record directory
(pickles: internal files, read back by the launcher that wrote the run directory).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.events import EventKind

#: File names inside a server's record directory.
API_RECORD_NAME = "api-server-{index}.pkl"
ENGINE_RECORD_NAME = "engine-{index}.pkl"


@dataclass(slots=True)
class EngineRecord:
    """One EngineCore's records."""

    engine_index: int
    log: dict[str, Any]  # EventLog.export()
    max_model_len: int
    num_gpu_blocks: int
    device: str
    #: req_id -> when the engine's input thread received it (before the busy loop took it)
    received_s: dict[str, float] = field(default_factory=dict)
    #: the engine's scheduling policy (engine.core.policy.policy_summary)
    scheduling_policy: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class APIServerRecord:
    """One API server's stage events and step deliveries."""

    client_index: int
    req_ids: list[str] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    payloads: list[int | str | None] = field(default_factory=list)
    #: internal req_id -> the client's own id (X-Request-Id), for joins with client records
    external_ids: dict[str, str] = field(default_factory=dict)
    #: (engine index, step id) -> when the output handler had processed the step's outputs
    #: (detokenized, handed to the requests' streams)
    step_processed_s: dict[tuple[int, int], float] = field(default_factory=dict)
    #: (engine index, step id) -> when the step's last token reached a client of this server
    step_delivered_s: dict[tuple[int, int], float] = field(default_factory=dict)
    #: the run clock's origin (``CLOCK_MONOTONIC`` seconds): a client on the same host puts its
    #: own monotonic readings on the run's clock by subtracting it
    clock_origin_s: float | None = None


class StageRecorder:
    """An API server's recorder; records nothing unless ``enabled``."""

    def __init__(self, client_index: int, enabled: bool,
                 clock_origin_s: float | None = None) -> None:
        self.enabled = enabled
        self.record = APIServerRecord(client_index, clock_origin_s=clock_origin_s)

    def event(
        self, req_id: str, kind: EventKind, time_s: float, payload: int | str | None = None
    ) -> None:
        if not self.enabled:
            return
        r = self.record
        r.req_ids.append(req_id)
        r.kinds.append(int(kind))
        r.times_s.append(time_s)
        r.payloads.append(payload)

    def external_id(self, req_id: str, external: str) -> None:
        if self.enabled:
            self.record.external_ids[req_id] = external

    def processed(self, engine_index: int, step_id: int, time_s: float) -> None:
        """The output handler is done with one engine message of step ``step_id``."""
        if self.enabled:
            self.record.step_processed_s[(engine_index, step_id)] = time_s

    def delivered(self, engine_index: int, step_ids: list[int], time_s: float) -> None:
        """Tokens of these steps reached a client at ``time_s``."""
        if not self.enabled:
            return
        delivered = self.record.step_delivered_s
        for step_id in step_ids:
            key = (engine_index, step_id)
            if delivered.get(key, -1.0) < time_s:
                delivered[key] = time_s

    def write(self, record_dir: str | Path) -> Path:
        path = Path(record_dir) / API_RECORD_NAME.format(index=self.record.client_index)
        write_pickle(path, self.record)
        return path


def write_pickle(path: Path, value: object) -> None:
    """``value`` pickled to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def read_pickle(path: Path) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)
