"""EventLog step records: single records and column blocks agree; bad values are refused with
the column's name and leave the log as it was."""

from __future__ import annotations

import itertools

import pytest

from engine.core.events import (
    STEP_COLUMNS,
    STEP_ROWS_BUFFERED,
    EventKind,
    EventLog,
    StepColumns,
    StepRecord,
)


def _step(step_id: int, blocker: str = "") -> StepRecord:
    return StepRecord(
        step_id=step_id, schedule_time_s=0.5 * step_id, execute_start_s=0.5 * step_id + 0.1,
        execute_end_s=0.5 * step_id + 0.3, update_time_s=0.5 * step_id + 0.4, num_reqs=3,
        num_tokens=3, num_prefill_reqs=0, num_prefill_tokens=0, num_decode_reqs=3,
        decode_context_sum=100 + step_id, num_sampled_tokens=3, num_new_reqs=0,
        num_resumed_reqs=0, num_preempted_reqs=0, num_finished_reqs=step_id % 2,
        num_running=3 - step_id % 2, num_waiting=4, kv_usage=0.25 * step_id,
        admission_blocker=blocker, cost_s=0.2, replica=1,
    )


def _row(step: StepRecord) -> tuple[object, ...]:
    return tuple(getattr(step, name) for name in STEP_COLUMNS)


def _block(steps: list[StepRecord]) -> StepColumns:
    return StepColumns(*[[getattr(s, name) for s in steps] for name in STEP_COLUMNS])


def _columns(log: EventLog) -> dict[str, list[object]]:
    return {name: list(values) for name, values in log.steps_columns().items()}  # type: ignore[call-overload]


def test_rows_row_blocks_and_column_blocks_agree() -> None:
    steps = [_step(i, "token_budget" if i % 3 else "") for i in range(12)]
    by_row = EventLog()
    for s in steps:
        by_row.record_step(s)
    mixed = EventLog()
    mixed.record_step(steps[0])  # buffered: the blocks below must keep the order
    for s in steps[1:4]:
        mixed.record_step(s)
    mixed.record_steps(StepColumns.from_mapping(
        {name: [getattr(s, name) for s in steps[4:7]] for name in STEP_COLUMNS}
    ))
    for s in steps[7:9]:
        mixed.record_step(s)
    mixed.record_step(steps[9])
    mixed.record_steps(_block(steps[10:12]))
    assert mixed.num_steps == by_row.num_steps == 12
    assert _columns(mixed) == _columns(by_row)
    assert list(_columns(mixed)) == list(STEP_COLUMNS)


def test_buffered_rows_join_the_columns_in_blocks() -> None:
    log = EventLog()
    rows = [_step(i) for i in range(STEP_ROWS_BUFFERED + 5)]
    for row in rows:
        log.record_step(row)
    assert log.num_steps == len(rows)
    assert _columns(log)["step_id"] == list(range(len(rows)))


def test_columns_read_between_growths_hold_exactly_the_steps_so_far() -> None:
    """The stored columns grow ahead of the steps (``EventLog._append_columns``): a read sees
    every step recorded so far and no placeholder row, and recording goes on after it."""
    steps = [_step(i, "kv_cache" if i % 5 == 0 else "") for i in range(7 * STEP_ROWS_BUFFERED + 3)]
    log, by_row = EventLog(), EventLog()
    cut_points = [0, 1, STEP_ROWS_BUFFERED, 3 * STEP_ROWS_BUFFERED + 1, len(steps)]
    for start, stop in itertools.pairwise(cut_points):
        log.record_steps(_block(steps[start:stop]))
        for s in steps[start:stop]:
            by_row.record_step(s)
        assert log.num_steps == stop
        assert _columns(log) == _columns(by_row)
        assert all(len(column) == stop for column in _columns(log).values())
    exported = EventLog.from_export(log.export())
    assert _columns(exported) == _columns(by_row)
    assert list(log.iter_events()) == list(by_row.iter_events())


def test_record_steps_refuses_bad_columns_and_records_nothing() -> None:
    log = EventLog()
    log.record_step(_step(0))
    good = {name: [getattr(_step(1), name)] for name in STEP_COLUMNS}
    with pytest.raises(ValueError, match="one equal-length list"):
        log.record_steps(StepColumns.from_mapping(
            {k: v for k, v in good.items() if k != "cost_s"}
        ))
    with pytest.raises(ValueError, match="one equal-length list"):
        log.record_steps(StepColumns.from_mapping({**good, "cost_s": [0.0, 1.0]}))
    for name, bad in (("num_reqs", [1.5]), ("num_running", ["x"]), ("kv_usage", ["x"]),
                      ("admission_blocker", [3]), ("replica", [2**40])):
        with pytest.raises(TypeError, match=repr(name)):
            log.record_steps(StepColumns.from_mapping({**good, name: bad}))
    assert _columns(log) == {name: [getattr(_step(0), name)] for name in STEP_COLUMNS}
    log.record_steps(StepColumns.from_mapping(good))
    assert log.num_steps == 2


def test_a_bad_buffered_row_fails_its_flush_without_a_partial_append() -> None:
    log = EventLog()
    log.record_step(_step(0))
    log.steps_columns()
    bad = list(_row(_step(1)))
    # an int beyond the int32 column (a float would not even make a compiled StepRecord)
    bad[STEP_COLUMNS.index("num_waiting")] = 2**40
    log.record_step(StepRecord(*bad))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'num_waiting'"):
        log.steps_columns()
    assert {len(v) for v in log._steps.values()} == {1}  # every column still one step long


def test_column_blocks_are_checked_when_they_join_the_columns() -> None:
    log = EventLog()
    log.record_step(_step(0))
    log.steps_columns()  # joined the typed columns
    with pytest.raises(ValueError, match="22 columns"):
        three = dict(zip(STEP_COLUMNS[:3], [[1]] * 3, strict=True))
        log.record_steps(StepColumns.from_mapping(three))
    with pytest.raises(ValueError, match="equal-length"):
        log.record_steps(StepColumns(*[[1]] * (len(STEP_COLUMNS) - 1), [1, 2]))
    columns = [[getattr(_step(1), n)] for n in STEP_COLUMNS]
    columns[STEP_COLUMNS.index("num_reqs")] = [2.5]
    log.record_steps(StepColumns(*columns))
    with pytest.raises(TypeError, match="'num_reqs'"):
        log.steps_columns()
    assert {len(v) for v in log._steps.values()} == {1}  # nothing appended


def test_large_integers_and_floats_in_int_and_float_columns() -> None:
    """Values the struct packing refuses fall back to array's own rules (same errors)."""
    log = EventLog()
    row = list(_row(_step(0)))
    row[STEP_COLUMNS.index("kv_usage")] = 1  # an int in a float column: accepted
    row[STEP_COLUMNS.index("decode_context_sum")] = 2**40  # int64 column
    log.record_step(StepRecord(*row))  # type: ignore[arg-type]
    cols = log.steps_columns()
    assert cols["kv_usage"][0] == 1.0 and cols["decode_context_sum"][0] == 2**40
    row[STEP_COLUMNS.index("num_reqs")] = 2**40  # an int32 column: too large
    log.record_step(StepRecord(*row))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'num_reqs' takes integers"):
        log.steps_columns()


def test_each_field_lands_in_its_own_column() -> None:
    """Every StepRecord field, and every StepColumns list, is stored under its own name."""
    values: dict[str, object] = {}
    for i, name in enumerate(STEP_COLUMNS):
        kind = type(getattr(_step(0), name))
        values[name] = f"b{i}" if kind is str else kind(100 + i)
    by_record, by_columns = EventLog(), EventLog()
    by_record.record_step(StepRecord(**values))  # type: ignore[arg-type]
    by_columns.record_steps(StepColumns(**{name: [v] for name, v in values.items()}))
    for log in (by_record, by_columns):
        assert _columns(log) == {name: [value] for name, value in values.items()}


def test_a_log_rebuilt_from_its_export_reads_the_same() -> None:
    log = EventLog()
    for i in range(3):
        log.record(f"r{i}", EventKind.ARRIVAL, 0.1 * i, 10 + i)
    log.record("r1", EventKind.FINISHED, 2.0, "length")
    for step in range(5):
        log.record_step(_step(step, "token_budget" if step == 2 else ""))
        log.record_token("r0", step)
        if step > 2:
            log.record_token("r1", step)
        log.record_delivery(step, 0.5 * step + 0.45)
    log.close_request("r0")
    rebuilt = EventLog.from_export(log.export())
    assert list(rebuilt.iter_events()) == list(log.iter_events())
    assert _columns(rebuilt) == _columns(log)
    assert rebuilt.delivered_times() == log.delivered_times()
    assert rebuilt.index_of("r2") == 2 and rebuilt.num_steps == 5
    rebuilt.record("r3", EventKind.ARRIVAL, 1.0, 5)  # and it keeps growing
    assert rebuilt.req_ids == ["r0", "r1", "r2", "r3"]
    broken = log.export()
    broken["events"] = {**broken["events"], "time_s": list(broken["events"]["time_s"])[:-1]}
    with pytest.raises(ValueError, match="unequal lengths"):
        EventLog.from_export(broken)
    with pytest.raises(ValueError, match="repeat a request"):
        EventLog.from_export({**log.export(), "req_ids": ["r0", "r0", "r2"]})
