"""``build_tables`` on hand-built logs: stage times, derived metrics and breakdown segments."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.core.events import EventKind as K
from engine.core.events import EventLog
from reports.breakdown import SEGMENTS, column, path_segments
from reports.tables import build_tables
from tests.reports.logs import add_steps, known_log


@pytest.fixture(scope="module")
def tables():
    return build_tables(known_log())


def row(tables, req_id: str) -> pd.Series:
    req = tables.requests
    return req[req["req_id"] == req_id].iloc[0]


def test_one_row_per_request_in_index_order(tables):
    req = tables.requests
    assert req["req_id"].tolist() == ["a", "c", "b", "d"]
    assert req["req_index"].tolist() == [0, 1, 2, 3]
    assert req["success"].tolist() == [True, True, True, False]


def test_stage_times_and_counts(tables):
    a, b, c, d = (row(tables, x) for x in "abcd")
    assert (a.arrival_s, a.frontend_start_s, a.tokenized_s, a.engine_enqueued_s) == (
        0.0, 0.1, 0.2, 0.5)
    assert (a.scheduled_s, a.first_token_s, a.finished_s, a.delivered_s) == (2.0, 2.5, 4.5, 4.6)
    assert c.scheduled_s == 1.0  # the first admission, not the resume at 4.0
    assert (a.num_prompt_tokens, b.num_prompt_tokens, c.num_prompt_tokens) == (10, 20, 30)
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (3, 1, 4)
    assert (a.num_preemptions, c.num_preemptions, c.num_schedules) == (0, 1, 2)
    assert (a.prefix_hit_tokens, c.prefix_hit_tokens) == (4, 16)  # at first admission
    assert (a.finish_reason, c.finish_reason) == ("stop", "length")
    assert d.rejected_reason == "prompt too long" and pd.isna(d.finish_reason)
    assert np.isnan(d.ttft_s) and np.isnan(d.scheduled_s) and d.rejected_s == 2.0


def test_client_metrics(tables):
    a, b, c = (row(tables, x) for x in "abc")
    assert a.ttft_s == pytest.approx(2.6) and a.e2el_s == pytest.approx(4.6)
    assert a.tpot_s == pytest.approx(1.0)
    assert b.ttft_s == pytest.approx(2.6) and b.e2el_s == pytest.approx(2.6)
    assert np.isnan(b.tpot_s)  # one output token: no TPOT
    assert c.ttft_s == pytest.approx(1.1) and c.e2el_s == pytest.approx(6.1)
    assert c.tpot_s == pytest.approx(5.0 / 3)


def test_engine_intervals(tables):
    a, c = row(tables, "a"), row(tables, "c")
    assert a.queue_time_s == pytest.approx(1.5)
    assert a.prefill_time_s == pytest.approx(0.5)
    assert a.decode_time_s == pytest.approx(2.0)  # first token 2.5 -> last token 4.5
    assert a.inference_time_s == pytest.approx(2.5)
    assert c.decode_time_s == pytest.approx(5.0)  # preemption included
    assert c.last_token_s == 6.5


def test_waiting_split_by_blocker(tables):
    a, b, c = (row(tables, x) for x in "abc")
    # a waits 0.5 -> 2.0: before the first schedule() (0.5), then step 0's kv_cache (1.0)
    assert a[column("wait_next_step")] == pytest.approx(0.5)
    assert a[column("wait_kv_cache")] == pytest.approx(1.0)
    assert a[column("wait_token_budget")] == 0.0
    # b waits 1.3 -> 3.0: kv_cache until 2.0, then step 1's token_budget until 3.0
    assert b[column("wait_kv_cache")] == pytest.approx(0.7)
    assert b[column("wait_token_budget")] == pytest.approx(1.0)
    assert b[column("wait_next_step")] == pytest.approx(0.0, abs=1e-12)
    assert c[column("wait_next_step")] == pytest.approx(0.4)


def test_segments_are_consecutive_and_sum_to_latencies(tables):
    req = tables.requests[tables.requests["success"]]
    for path, latency in (("ttft", "ttft_s"), ("e2el", "e2el_s")):
        total = sum(req[column(s.name)] for s in path_segments(path))
        np.testing.assert_allclose(total, req[latency], rtol=1e-12, atol=1e-12)
        for s in path_segments(path):
            assert (req[column(s.name)] >= -1e-12).all(), s.name
    a = row(tables, "a")
    expected = {"client_to_frontend": 0.1, "frontend_cpu": 0.1, "ipc_in": 0.3,
                "prefill": 0.5, "output_first": 0.1, "decode": 2.0, "output_last": 0.1}
    for name, value in expected.items():
        assert a[column(name)] == pytest.approx(value), name
    assert {column(s.name) for s in SEGMENTS} <= set(tables.requests.columns)


def test_steps_sorted_with_delivery_times(tables):
    steps = tables.steps
    assert steps["step_id"].tolist() == list(range(6))
    np.testing.assert_allclose(steps["delivered_time_s"], 1.6 + np.arange(6))
    assert steps["admission_blocker"].astype(str).tolist()[:3] == ["kv_cache", "token_budget", ""]


def test_token_runs_sorted(tables):
    runs = tables.token_runs
    assert runs.values.tolist() == [[0, 1, 3], [1, 0, 2], [1, 4, 2], [2, 2, 1]]


def test_missing_front_end_stages_collapse_to_zero():
    """An offline run (no API server): the segments still sum to the latency."""
    log = EventLog()
    log.record("x", K.ARRIVAL, 0.0, 8)
    log.record("x", K.ENGINE_ENQUEUED, 0.0)
    log.record("x", K.SCHEDULED, 1.0, 0)
    log.record("x", K.FIRST_TOKEN, 1.5)
    log.record_token("x", 0)
    log.record_token("x", 1)
    log.record("x", K.FINISHED, 2.5, "length")
    log.close_request("x")
    add_steps(log, 2)
    r = build_tables(log).requests.iloc[0]
    assert r[column("client_to_frontend")] == 0.0 and r[column("frontend_cpu")] == 0.0
    assert r[column("ipc_in")] == 0.0 and r[column("wait_next_step")] == pytest.approx(1.0)
    assert r.ttft_s == pytest.approx(1.6) and r.tpot_s == pytest.approx(1.0)
    assert np.isnan(r.delivered_s) and r.success


def test_open_runs_and_unfinished_requests_count_as_failed():
    log = EventLog()
    log.record("x", K.ARRIVAL, 0.0, 8)
    log.record("x", K.SCHEDULED, 1.0, 0)
    log.record_token("x", 0)  # never finished: run still open
    add_steps(log, 1)
    t = build_tables(log)
    assert t.token_runs.values.tolist() == [[0, 0, 1]]
    assert not t.requests["success"].iloc[0]


def test_empty_log():
    t = build_tables(EventLog())
    assert len(t.requests) == 0 and len(t.steps) == 0 and len(t.token_runs) == 0


def _assert_same_tables(a, b) -> None:
    for name in ("requests", "steps", "token_runs"):
        x, y = getattr(a, name), getattr(b, name)
        pd.testing.assert_frame_equal(x, y, check_exact=True)


def test_an_exported_log_builds_the_same_tables():
    """A report process builds its tables from ``EventLog.export()`` (pickled): identical."""
    import pickle

    from reports.tables import ExportedLog

    log = known_log()
    exported = pickle.loads(pickle.dumps(log.export()))
    _assert_same_tables(build_tables(ExportedLog(exported)), build_tables(log))


def test_a_handed_over_log_builds_the_same_tables_and_is_freed_as_it_goes():
    """``take_export`` moves the storage out (the log is left empty and still usable); an
    owned export is read once, part by part, so nothing of it is left when the tables are
    built, and the tables equal those of the log."""
    from reports.tables import ExportedLog

    log = known_log()
    log.record_labels("a", "team-1", "interactive")
    want = build_tables(log)
    exported = log.take_export()
    assert log.num_steps == 0 and log.req_ids == [] and len(log.events_columns()["kind"]) == 0
    assert len(log.token_runs()["req_index"]) == 0 and log.labels_columns()["req_index"] == []
    got = build_tables(ExportedLog(exported, owned=True))
    _assert_same_tables(got, want)
    assert exported == {}
    log.record("z", K.ARRIVAL, 0.0, 3)  # an emptied log is a new log
    assert log.req_ids == ["z"] and len(build_tables(log).requests) == 1


def test_taking_the_tables_of_a_finished_log_empties_it():
    from reports.tables import take_columns

    log = known_log()
    want = build_tables(log)
    _assert_same_tables(take_columns(log).to_frames(), want)
    assert log.num_steps == 0 and log.req_ids == []


def test_the_blocker_column_is_the_categorical_of_its_strings():
    from reports.columns import ColumnTable, Labels, to_frame

    for values in (["", "token_budget", "kv_cache", "", "token_budget"], [], ["max_num_seqs"]):
        labels = Labels.sorted_from(values)
        got = to_frame(ColumnTable({"b": labels}))["b"].array
        want = pd.Categorical(values)
        assert list(got.categories) == list(want.categories)
        assert got.categories.dtype == want.categories.dtype
        assert list(got.codes) == list(want.codes)


def test_delivery_times_align_with_steps_and_a_double_delivery_is_refused():
    from reports.tables import _by_step

    steps = np.array([2, 3, 5, 8])
    got = _by_step(steps, np.array([8, 3, 9, 0]), np.array([0.8, 0.3, 0.9, 0.0]))
    np.testing.assert_array_equal(got, [np.nan, 0.3, np.nan, 0.8])
    assert np.isnan(_by_step(steps, np.array([], dtype=np.int64), np.array([]))).all()
    with pytest.raises(ValueError, match="delivered twice"):
        _by_step(steps, np.array([3, 3]), np.array([0.3, 0.4]))
