"""EventLog token runs: tokens added one at a time (``record_token``) or many at once
(``record_tokens``) make the same runs — maximal stretches of consecutive steps per request,
as a per-token reference computes them — whether a request's runs are still open or were
closed by ``close_request``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.events import EventKind, EventLog

# (request, number of steps skipped before the next token batch, tokens in it)
_OPS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 4)), max_size=40
)


def _runs(log: EventLog) -> set[tuple[str, int, int]]:
    cols = log.token_runs()
    return {
        (log.req_ids[i], f, n)
        for i, f, n in zip(cols["req_index"], cols["first_step"], cols["num_tokens"],
                           strict=True)
    }


def _reference(tokens: dict[str, list[int]]) -> set[tuple[str, int, int]]:
    """Maximal runs of consecutive step ids, from every token's step."""
    out = set()
    for req_id, steps in tokens.items():
        start = prev = None
        for s in steps:
            if prev is not None and s == prev + 1:
                prev = s
                continue
            if start is not None and prev is not None:
                out.add((req_id, start, prev - start + 1))
            start = prev = s
        if start is not None and prev is not None:
            out.add((req_id, start, prev - start + 1))
    return out


def _replay(ops: list[tuple[int, int, int]], one_at_a_time: bool, close: set[int]
            ) -> tuple[EventLog, dict[str, list[int]]]:
    log = EventLog()
    next_step = {r: 0 for r in range(4)}
    tokens: dict[str, list[int]] = {}
    for r in range(4):
        log.record(str(r), EventKind.ARRIVAL, 0.0)
    for r, skip, n in ops:
        req_id = str(r)
        first = next_step[r] + skip
        if one_at_a_time:
            for k in range(n):
                log.record_token(req_id, first + k)
        else:
            log.record_tokens(req_id, first, n)
        tokens.setdefault(req_id, []).extend(range(first, first + n))
        next_step[r] = first + n
    for r in sorted(close):
        log.close_request(str(r))
    return log, tokens


@settings(max_examples=200, deadline=None)
@given(_OPS, st.sets(st.integers(0, 3)))
def test_single_tokens_and_batches_make_the_reference_runs(
    ops: list[tuple[int, int, int]], close: set[int]
) -> None:
    for one_at_a_time in (True, False):
        log, tokens = _replay(ops, one_at_a_time, close)
        assert _runs(log) == _reference(tokens)
        assert sum(log.token_runs()["num_tokens"]) == sum(map(len, tokens.values()))


def test_a_gap_closes_a_run_and_a_closed_request_keeps_its_runs() -> None:
    log = EventLog()
    log.record("a", EventKind.ARRIVAL, 0.0)
    log.record("b", EventKind.ARRIVAL, 0.0)
    log.record_token("a", 3)
    log.record_token("a", 4)
    log.record_tokens("a", 5, 2)  # continues
    log.record_tokens("b", 4, 0)  # nothing
    log.record_token("a", 9)  # a gap: a new run
    log.close_request("a")
    log.close_request("b")  # no tokens: nothing to close
    log.record_tokens("b", 10, 3)
    assert _runs(log) == {("a", 3, 4), ("a", 9, 1), ("b", 10, 3)}


def test_a_token_of_an_unknown_request_is_refused() -> None:
    log = EventLog()
    with pytest.raises(KeyError):
        log.record_token("nobody", 0)
    with pytest.raises(KeyError):
        log.record_tokens("nobody", 0, 2)
    log.close_request("nobody")  # closing what never ran is a no-op
    assert _runs(log) == set()


def test_stage_events_read_back_whole_across_the_buffer() -> None:
    """Stage events wait in a buffer before joining the typed columns (every
    ``EVENTS_BUFFERED`` events, or when the columns are read): whenever they are read, every
    event is there, in recording order, with its values."""
    from engine.core.events import EVENTS_BUFFERED

    log = EventLog()
    n = EVENTS_BUFFERED + 3
    kinds = list(EventKind)
    expected = []
    for i in range(n):
        req_id, kind = str(i % 7), kinds[i % len(kinds)]
        payload: int | str | None = i if i % 3 == 0 else ("x" if i % 3 == 1 else None)
        log.record(req_id, kind, 0.25 * i, payload)
        expected.append((int(req_id), int(kind), 0.25 * i, payload))
        if i in (5, EVENTS_BUFFERED - 1):  # read in the middle too
            assert len(log.events_columns()["time_s"]) == i + 1  # type: ignore[arg-type]
    cols = log.events_columns()
    rows = list(zip(cols["req_index"], cols["kind"], cols["time_s"], cols["payload"],  # type: ignore[call-overload]
                    strict=True))
    assert [(int(log.req_ids[r]), k, t, p) for r, k, t, p in rows] == expected
    assert len(list(log.iter_events(expand_tokens=False))) == n
    rebuilt = EventLog.from_export(log.export())
    assert list(rebuilt.events_columns()["time_s"]) == [e[2] for e in expected]  # type: ignore[call-overload]


def test_columns_a_reader_holds_stay_of_one_length() -> None:
    """``events_columns`` hands out the log's own columns: events recorded after it join all
    four together, when they are flushed."""
    log = EventLog()
    log.record("a", EventKind.ARRIVAL, 0.0, 12)
    cols = log.events_columns()
    log.record("a", EventKind.FINISHED, 1.0, "length")
    assert len({len(cols[k]) for k in ("req_index", "kind", "time_s", "payload")}) == 1  # type: ignore[arg-type]
    log.events_columns()  # flushes into the same columns
    assert [len(cols[k]) for k in ("req_index", "kind", "time_s", "payload")] == [2] * 4  # type: ignore[arg-type]
