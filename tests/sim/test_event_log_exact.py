"""Exact event logs of tiny simulations whose times can be computed by hand.

Costs (tests/sim/helpers.py): a step takes 10 ms + 1 ms per scheduled token; the API server
spends 1 ms per request; IPC takes 0.5 ms each way; the output processor 0.2 ms per step; the
engine's own CPU costs are zero unless stated. Times in the comments are in ms.
"""

from __future__ import annotations

import dataclasses

from engine.core.config import EngineKnobs
from tests.sim.helpers import SIMPLE_FRONTEND, HostLinearCostModel, events, simulate, workload

SYNC = EngineKnobs(async_scheduling=False)


def test_one_request() -> None:
    # send 0 -> API server 0..1 -> engine input 1.5; prefill 10 tok: 1.5 + 20 = 21.5 (token 1);
    # decodes of 11 ms: 32.5, 43.5 (token 3, length). Deliveries: +0.5 IPC +0.2 processing.
    r = simulate(workload([0.0], [10], [3]), engine=SYNC)
    assert events(r) == [
        ("0", "ARRIVAL", 0.0, 10),
        ("0", "FRONTEND_START", 0.0, None),
        ("0", "TOKENIZED", 0.001, None),
        ("0", "ENGINE_ENQUEUED", 0.0015, None),
        ("0", "SCHEDULED", 0.0015, 0),
        ("0", "FIRST_TOKEN", 0.0215, None),
        ("0", "TOKEN", 0.0215, 0),
        ("0", "TOKEN", 0.0325, 1),
        ("0", "TOKEN", 0.0435, 2),
        ("0", "FINISHED", 0.0435, "length"),
        ("0", "DELIVERED", 0.0442, None),
    ]
    delivered = r.event_log.delivered_times()
    assert [round(delivered[s], 9) for s in (0, 1, 2)] == [0.0222, 0.0332, 0.0442]


def test_two_requests_contending() -> None:
    # B waits for the single API server (1..2) and then for the engine, busy with A's prefill
    # until 31.5; it joins A's decode step (1 + 20 tokens = 31 ms) and finishes a step later.
    r = simulate(
        workload([0.0, 0.0001], [20, 20], [2, 2]),
        engine=EngineKnobs(async_scheduling=False, max_num_batched_tokens=24, max_num_seqs=24),
    )
    assert events(r) == [
        ("0", "ARRIVAL", 0.0, 20),
        ("0", "FRONTEND_START", 0.0, None),
        ("1", "ARRIVAL", 0.0001, 20),
        ("1", "FRONTEND_START", 0.001, None),
        ("0", "TOKENIZED", 0.001, None),
        ("0", "ENGINE_ENQUEUED", 0.0015, None),
        ("0", "SCHEDULED", 0.0015, 0),
        ("1", "TOKENIZED", 0.002, None),
        ("1", "ENGINE_ENQUEUED", 0.0315, None),
        ("1", "SCHEDULED", 0.0315, 0),
        ("0", "FIRST_TOKEN", 0.0315, None),
        ("0", "TOKEN", 0.0315, 0),
        ("1", "FIRST_TOKEN", 0.0625, None),
        ("0", "TOKEN", 0.0625, 1),
        ("1", "TOKEN", 0.0625, 1),
        ("0", "FINISHED", 0.0625, "length"),
        ("0", "DELIVERED", 0.0632, None),
        ("1", "TOKEN", 0.0735, 2),
        ("1", "FINISHED", 0.0735, "length"),
        ("1", "DELIVERED", 0.0742, None),
    ]


def test_preemption_and_resume_with_prefix_hit() -> None:
    # Block size 4, 5 usable blocks. A (8+8 tokens) and B (4+8) share the cache until A needs
    # its 4th block at step 5 (70.5 ms): FCFS preempts B, the most recent admission. B's first
    # block (its prompt) stays cached; B cannot come back while A runs (KV), and resumes after
    # A finishes with a 4-token prefix hit, recomputing its 4 generated tokens.
    r = simulate(
        workload([0.0, 0.0001], [8, 4], [8, 8]),
        engine=EngineKnobs(async_scheduling=False, max_num_batched_tokens=16, max_num_seqs=16,
                           block_size=4),
        num_gpu_blocks=6,
        max_model_len=20,
    )
    engine_events = [e for e in events(r) if e[1] not in ("ARRIVAL", "FRONTEND_START", "TOKENIZED")]
    assert engine_events == [
        ("0", "ENGINE_ENQUEUED", 0.0015, None),
        ("0", "SCHEDULED", 0.0015, 0),
        ("1", "ENGINE_ENQUEUED", 0.0195, None),
        ("1", "SCHEDULED", 0.0195, 0),
        ("0", "FIRST_TOKEN", 0.0195, None),
        ("0", "TOKEN", 0.0195, 0),
        ("1", "FIRST_TOKEN", 0.0345, None),
        ("0", "TOKEN", 0.0345, 1),
        ("1", "TOKEN", 0.0345, 1),
        ("0", "TOKEN", 0.0465, 2),
        ("1", "TOKEN", 0.0465, 2),
        ("0", "TOKEN", 0.0585, 3),
        ("1", "TOKEN", 0.0585, 3),
        ("1", "PREEMPTED", 0.0705, None),
        ("0", "TOKEN", 0.0705, 4),
        ("1", "TOKEN", 0.0705, 4),
        ("0", "TOKEN", 0.0815, 5),
        ("0", "TOKEN", 0.0925, 6),
        ("1", "SCHEDULED", 0.1035, 4),
        ("0", "TOKEN", 0.1035, 7),
        ("0", "FINISHED", 0.1035, "length"),
        ("0", "DELIVERED", 0.1042, None),
        ("1", "TOKEN", 0.1175, 8),
        ("1", "TOKEN", 0.1285, 9),
        ("1", "TOKEN", 0.1395, 10),
        ("1", "TOKEN", 0.1505, 11),
        ("1", "FINISHED", 0.1505, "length"),
        ("1", "DELIVERED", 0.1512, None),
    ]
    steps = r.event_log.steps_columns()
    assert list(steps["admission_blocker"])[5:8] == ["preemption", "kv_cache", "kv_cache"]


def test_async_scheduling_hides_scheduler_cpu_time() -> None:
    # With 2 ms of scheduling CPU per step, synchronous steps take 2 ms longer each; under async
    # scheduling step N+1 is scheduled while step N runs, so only the first one pays it.
    fe = dataclasses.replace(SIMPLE_FRONTEND, schedule_overhead_s=0.002)
    tokens = {}
    for is_async in (True, False):
        r = simulate(workload([0.0], [10], [3]), engine=EngineKnobs(async_scheduling=is_async),
                     frontend=fe)
        tokens[is_async] = [e[2] for e in events(r) if e[1] == "TOKEN"]
    assert tokens[False] == [0.0235, 0.0365, 0.0495]
    assert tokens[True] == [0.0235, 0.0345, 0.0455]


def test_idle_wakeup_cost_is_paid_by_the_first_step_after_an_idle_loop() -> None:
    # Wake-up 4 ms, reached after 20 ms of idleness. Request 0 is enqueued at 1.5 after 1.5 ms
    # idle: its prefill pays 4 × 1.5/20 = 0.3 (1.5 + 20 + 0.3 = 21.8); its decode runs back to
    # back (+11 = 32.8). Request 1 is sent at 100 and enqueued at 101.5 after 68.7 ms idle: it
    # pays the whole 4 ms (101.5 + 20 + 4 = 125.5), then 136.5.
    fe = dataclasses.replace(SIMPLE_FRONTEND, idle_wakeup_s=0.004, idle_wakeup_ramp_s=0.02)
    r = simulate(workload([0.0, 0.1], [10, 10], [2, 2]), engine=SYNC, frontend=fe)
    tokens = [(e[0], round(e[2], 9)) for e in events(r) if e[1] == "TOKEN"]
    assert tokens == [("0", 0.0218), ("0", 0.0328), ("1", 0.1255), ("1", 0.1365)]
    steps = r.event_log.steps_columns()
    costs = [c for c, n in zip(steps["cost_s"], steps["num_tokens"], strict=True) if n]
    assert [round(c, 9) for c in costs] == [0.0203, 0.011, 0.024, 0.011]


def test_idle_wakeup_cost_defaults_to_zero_and_leaves_busy_loops_alone() -> None:
    # Without a wake-up cost the times are the plain ones; with one, a loop that never idles
    # between requests (B arrives while A runs) pays it only once, at the start.
    base = simulate(workload([0.0, 0.001], [10, 10], [3, 3]), engine=SYNC)
    fe = dataclasses.replace(SIMPLE_FRONTEND, idle_wakeup_s=0.004)
    woken = simulate(workload([0.0, 0.001], [10, 10], [3, 3]), engine=SYNC, frontend=fe)
    t0 = [e[2] for e in events(base) if e[1] == "TOKEN"]
    t1 = [e[2] for e in events(woken) if e[1] == "TOKEN"]
    assert [round(b - a, 9) for a, b in zip(t0, t1, strict=True)] == [0.004] * len(t0)


def test_worker_host_time_precedes_the_kernels_and_async_scheduling_hides_it() -> None:
    # The cost model says each step needs 3 ms of input preparation before its first kernel
    # and 1 ms of launching (overlapping the kernels). Synchronous: every step pays the 3 ms
    # (prefill 1.5 + 3 + 20 = 24.5, then 24.5 + 3 + 11 = 38.5, 52.5). Async: step N+1 is
    # prepared and launched (by 5.5 + 3 + 1 = 9.5) while step N runs, so only the first pays it.
    cost = HostLinearCostModel(host_s=0.003, launch_s=0.001)
    tokens = {}
    for is_async in (True, False):
        for fast_path in (True, False):
            r = simulate(workload([0.0], [10], [3]), engine=EngineKnobs(async_scheduling=is_async),
                         cost_model=cost, fast_path=fast_path)
            got = [round(e[2], 9) for e in events(r) if e[1] == "TOKEN"]
            assert tokens.setdefault(is_async, got) == got
    assert tokens[False] == [0.0245, 0.0385, 0.0525]
    assert tokens[True] == [0.0245, 0.0355, 0.0465]
