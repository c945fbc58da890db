"""The EngineCore process's busy loop without its sockets: inputs in, per-API-server outputs
out, the scheduler's stats on exactly one message per step, aborts, the bounded event log."""

from __future__ import annotations

import queue

import pytest

from engine.core.events import EventLog
from engine.core.request import SamplingParams
from engine.entrypoints import engine_proc
from engine.entrypoints.engine_proc import EngineCoreProc, EngineProcConfig
from engine.entrypoints.wire import AbortRequests, AddRequest, EngineOutputs
from sim.config import SimConfig
from sim.emulation import EmulatedEngineFactory


def make_proc(record: bool = False) -> EngineCoreProc:
    clock_now = [0.0]

    def clock() -> float:
        clock_now[0] += 1e-3
        return clock_now[0]

    cfg = SimConfig(model="meta-llama/Llama-3.1-8B", num_gpu_blocks=64, max_model_len=512)
    engine = EmulatedEngineFactory(cfg, (11, 12, 13), fixed_step_s=0.0).build(clock)
    addresses = ("inproc://a", "inproc://b")
    return EngineCoreProc(
        EngineProcConfig(0, addresses, addresses, 0.0, "/dev/null" if record else None),
        engine, clock)


def add(proc: EngineCoreProc, req_id: str, client: int, max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    proc.inputs.put(AddRequest(req_id, list(range(100, 140)), params, 0.0, client))


def drain(proc: EngineCoreProc) -> list[tuple[int, EngineOutputs]]:
    sent = []
    while True:
        try:
            item = proc._outputs.get_nowait()
        except queue.Empty:
            return sent
        assert item is not None and isinstance(item[1], EngineOutputs)
        sent.append((item[0], item[1]))


def run_until_idle(proc: EngineCoreProc) -> list[tuple[int, EngineOutputs]]:
    sent = []
    while True:
        assert proc._take_inputs(block=False)
        if not proc.loop.has_work():
            proc._publish([], None)
            return sent + drain(proc)
        proc._publish(proc.loop.step(), proc.loop.applied_step_id)
        sent += drain(proc)


def test_outputs_go_to_their_api_server_and_stats_ride_on_one_message() -> None:
    proc = make_proc()
    add(proc, "0-0", 0, 3)
    add(proc, "1-0", 1, 5)
    sent = run_until_idle(proc)
    tokens: dict[str, list[int]] = {}
    for client, message in sent:
        for update in message.outputs:
            assert update.req_id.startswith(f"{client}-")  # its own API server only
            tokens.setdefault(update.req_id, []).extend(update.new_token_ids)
    assert tokens == {"0-0": [11, 12, 13], "1-0": [11, 12, 13, 11, 12]}
    steps: dict[int, int] = {}
    for _, message in sent:
        if message.stats is not None and message.step_id >= 0:
            steps[message.step_id] = steps.get(message.step_id, 0) + 1
    assert steps and set(steps.values()) == {1}  # never twice for one step
    last = [m.stats for _, m in sent if m.stats is not None][-1]
    assert last is not None and (last.num_running, last.num_waiting) == (0, 0)
    assert last.kv_cache_usage == 0.0
    finals = [u for _, m in sent for u in m.outputs if u.finish_reason is not None]
    assert {u.req_id: u.finish_reason for u in finals} == {"0-0": "length", "1-0": "length"}
    assert all(u.timing is not None and u.timing.queued_s <= u.timing.scheduled_s
               <= u.timing.first_token_s <= u.timing.last_token_s for u in finals)
    queries = sum(m.stats.prefix_cache_queries for _, m in sent if m.stats is not None)
    assert queries == 80  # two 40-token prompts admitted once each


def test_an_abort_frees_the_request_and_reports_the_idle_state() -> None:
    proc = make_proc()
    add(proc, "0-0", 0, 100)
    assert proc._take_inputs(block=False)
    proc._publish(proc.loop.step(), proc.loop.applied_step_id)
    assert proc.core.scheduler.kv_cache_manager.usage > 0
    drain(proc)
    proc.inputs.put(AbortRequests(["0-0"]))
    sent = run_until_idle(proc)
    assert all(u.finish_reason is None for _, m in sent for u in m.outputs)  # none sent back
    stats = [m.stats for _, m in sent if m.stats is not None]
    assert stats and stats[-1].num_running == 0 and stats[-1].kv_cache_usage == 0.0
    assert not proc._client_of


def test_a_refused_request_gets_an_error_output() -> None:
    proc = make_proc()
    proc.inputs.put(AddRequest("0-0", [10**9], SamplingParams(), 0.0, 1))
    sent = run_until_idle(proc)
    (client, message), *_ = sent
    assert client == 1 and message.outputs[0].finish_reason == "error"
    assert "out of vocabulary" in (message.outputs[0].error or "")


def test_an_idle_engine_that_records_nothing_starts_a_fresh_log(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_proc, "MAX_UNRECORDED_EVENTS", 10)
    proc = make_proc()
    for i in range(3):
        add(proc, f"0-{i}", 0, 2)
    first_log = proc.core.event_log
    run_until_idle(proc)
    proc._maybe_fresh_log()
    assert proc.core.event_log is not first_log
    assert isinstance(proc.core.event_log, EventLog)
    add(proc, "0-9", 0, 2)  # and serves on with it
    sent = run_until_idle(proc)
    assert [u.new_token_ids for _, m in sent for u in m.outputs] == [[11], [12]]
    recording = make_proc(record=True)
    add(recording, "0-0", 0, 2)
    kept = recording.core.event_log
    run_until_idle(recording)
    monkeypatch.setattr(engine_proc, "MAX_UNRECORDED_EVENTS", 0)
    recording._maybe_fresh_log()
    assert recording.core.event_log is kept  # a recording engine keeps everything
