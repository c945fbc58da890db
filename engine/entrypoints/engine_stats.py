"""What the EngineCore process reports besides tokens, read from the core's own event records.

The engine core writes every stage event of a request (enqueued, scheduled with its prefix-hit
tokens, preempted, first token, finished) into its ``EventLog``. ``EngineStatsTracker`` reads
the events appended since its last call, so the numbers behind the Prometheus metrics come
from the very records a run directory is built from:

* per live request: when it was queued, first scheduled, got its first token, how often it
  was preempted (sent with its finishing output as a ``RequestTiming``);
* counters since the last report: prefix-cache queries and hits at each admission (queried
  tokens = the request's tokens at that moment, hits = its prefix-hit payload; vLLM also
  counts lookups of requests that then do not fit, twinserve counts admissions) and
  preemptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.core.events import EventKind, EventLog
from engine.entrypoints.wire import RequestTiming, SchedulerStats


@dataclass(slots=True)
class _Live:
    num_tokens: int  # prompt + output tokens so far (what a prefix-cache lookup queries)
    queued_s: float = math.nan
    scheduled_s: float = math.nan
    first_token_s: float = math.nan
    num_preemptions: int = 0


class EngineStatsTracker:
    """Request timings and counter increments, from the events of one ``EventLog``."""

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self._cursor = 0  # events of the log already read
        self._live: dict[str, _Live] = {}
        self._queries = 0
        self._hits = 0
        self._preemptions = 0
        self._last_state: tuple[int, int, float] | None = None

    def use_log(self, log: EventLog) -> None:
        """The core writes into a fresh log from now on (only between requests)."""
        self._log = log
        self._cursor = 0

    def add(self, req_id: str, num_prompt_tokens: int) -> None:
        self._live[req_id] = _Live(num_prompt_tokens)

    def count_tokens(self, req_id: str, num_new_tokens: int) -> None:
        live = self._live.get(req_id)
        if live is not None:
            live.num_tokens += num_new_tokens

    def scan(self) -> None:
        """Read the events recorded since the last call."""
        cols = self._log.events_columns()
        kinds, times = cols["kind"], cols["time_s"]
        reqs, payloads = cols["req_index"], cols["payload"]
        req_ids = self._log.req_ids
        end = len(kinds)  # type: ignore[arg-type]
        for i in range(self._cursor, end):
            kind = kinds[i]  # type: ignore[index]
            live = self._live.get(req_ids[reqs[i]])  # type: ignore[index]
            if live is None:
                continue
            t = float(times[i])  # type: ignore[index]
            if kind == EventKind.ENGINE_ENQUEUED:
                live.queued_s = t
            elif kind == EventKind.SCHEDULED:
                if math.isnan(live.scheduled_s):
                    live.scheduled_s = t
                hit = payloads[i]  # type: ignore[index]
                self._queries += live.num_tokens
                self._hits += hit if isinstance(hit, int) else 0
            elif kind == EventKind.PREEMPTED:
                live.num_preemptions += 1
                self._preemptions += 1
            elif kind == EventKind.FIRST_TOKEN and math.isnan(live.first_token_s):
                live.first_token_s = t
        self._cursor = end

    def finish(self, req_id: str, last_token_s: float) -> RequestTiming | None:
        """The request ended: its timing (None if it was never added here)."""
        live = self._live.pop(req_id, None)
        if live is None:
            return None
        last = last_token_s if not math.isnan(live.first_token_s) else math.nan
        return RequestTiming(
            live.queued_s, live.scheduled_s, live.first_token_s, last, live.num_preemptions
        )

    def forget(self, req_id: str) -> None:
        self._live.pop(req_id, None)

    def stats(self, num_running: int, num_waiting: int, kv_usage: float) -> SchedulerStats | None:
        """The engine's state and the counters since the last call; None if nothing changed."""
        state = (num_running, num_waiting, kv_usage)
        if state == self._last_state and not (self._queries or self._hits or self._preemptions):
            return None
        self._last_state = state
        stats = SchedulerStats(
            num_running, num_waiting, kv_usage, self._queries, self._hits, self._preemptions
        )
        self._queries = self._hits = self._preemptions = 0
        return stats
