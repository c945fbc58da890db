"""EventLog step records: rows, column blocks, constant columns and typed arrays agree."""

from __future__ import annotations

from array import array

import pytest

from engine.core.events import STEP_COLUMNS, EventLog, StepRecord


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


def test_column_blocks_with_constants_and_arrays_equal_rows() -> None:
    steps = [_step(i, "token_budget") for i in range(5)]
    by_row = EventLog()
    for s in steps:
        by_row.record_step(s)
    by_block = EventLog()
    by_block.record_step(steps[0])  # a buffered row first: blocks must keep the order
    n = array("i", [3] * 4)  # one typed array for three equal columns
    by_block.record_steps({
        "step_id": range(1, 5),
        "schedule_time_s": [s.schedule_time_s for s in steps[1:]],
        "execute_start_s": [s.execute_start_s for s in steps[1:]],
        "execute_end_s": [s.execute_end_s for s in steps[1:]],
        "update_time_s": [s.update_time_s for s in steps[1:]],
        "num_reqs": n, "num_tokens": n, "num_decode_reqs": n,
        "num_prefill_reqs": 0, "num_prefill_tokens": 0,
        "decode_context_sum": array("i", [s.decode_context_sum for s in steps[1:]]),  # 'i'->'q'
        "num_sampled_tokens": 3, "num_new_reqs": 0, "num_resumed_reqs": 0,
        "num_preempted_reqs": 0,
        "num_finished_reqs": tuple(s.num_finished_reqs for s in steps[1:]),
        "num_running": [s.num_running for s in steps[1:]],
        "num_waiting": 4,
        "kv_usage": [s.kv_usage for s in steps[1:]],
        "admission_blocker": "token_budget",
        "cost_s": 0.2,
        "replica": 1,
    })
    a, b = by_row.steps_columns(), by_block.steps_columns()
    assert list(a) == list(b) == list(STEP_COLUMNS)
    for name in STEP_COLUMNS:
        assert list(a[name]) == list(b[name]), name  # type: ignore[call-overload]


def test_record_steps_refuses_missing_or_unequal_columns() -> None:
    log = EventLog()
    full: dict[str, object] = {name: [0] for name in STEP_COLUMNS}
    full["admission_blocker"] = [""]
    with pytest.raises(ValueError, match="one entry per StepRecord field"):
        log.record_steps({k: v for k, v in full.items() if k != "cost_s"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="equal-length"):
        log.record_steps({**full, "cost_s": [0.0, 1.0]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="equal-length"):
        log.record_steps(dict.fromkeys(STEP_COLUMNS, 0))  # constants only: no length
    log.record_steps(full)  # type: ignore[arg-type]
    assert log.num_steps == 1
