"""The API server's per-request output path, without processes: delta merging for slow
consumers, stop strings that never take streamed text back, the wire codec, and the join of
every process's records into one log."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from engine.core.events import EventKind, EventLog, StepRecord
from engine.core.sampling_params import SamplingParams
from engine.entrypoints.engine_stats import EngineStatsTracker
from engine.entrypoints.records import APIServerRecord, EngineRecord
from engine.entrypoints.stream import Delta, OutputStream, RequestText
from engine.entrypoints.wire import (
    AbortRequests,
    AddRequest,
    Codec,
    EngineInfo,
    EngineOutputs,
    EngineReady,
    RequestTiming,
    RequestUpdate,
    SchedulerStats,
)
from engine.serve.frontend import Tokenizer
from engine.worker.tiny_tokenizer import build_tokenizer_files
from experiments.serve.run_dir import ServedRecords, joined_log
from reports.tables import ExportedLog, build_tables


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    d = tmp_path_factory.mktemp("tok")
    build_tokenizer_files(d, "llama", 384)
    return Tokenizer.from_dir(d)


def delta(text: str, tokens: list[int], step: int, finish: str | None = None) -> Delta:
    return Delta(text, tokens, [step], 0, finish)


def test_a_slow_consumer_gets_one_merged_delta() -> None:
    async def run() -> list[Delta]:
        stream = OutputStream()
        for i in range(5):  # the producer runs ahead: nothing queues, everything merges
            stream.put(delta(f"t{i} ", [i], 10 + i, "length" if i == 4 else None))
        return [await stream.get()]

    (merged,) = asyncio.run(run())
    assert merged.text == "t0 t1 t2 t3 t4 "
    assert merged.token_ids == [0, 1, 2, 3, 4] and merged.step_ids == [10, 11, 12, 13, 14]
    assert merged.finish_reason == "length" and merged.num_updates == 5


def test_a_keeping_up_consumer_gets_every_delta_and_errors_end_the_stream() -> None:
    async def run() -> tuple[list[str], BaseException | None]:
        stream = OutputStream()
        got: list[str] = []

        async def consume() -> None:
            while True:
                got.append((await stream.get()).text)

        task = asyncio.create_task(consume())
        for i in range(3):
            stream.put(delta(str(i), [i], i))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        stream.fail(RuntimeError("engine died"))
        try:
            await task
        except RuntimeError as exc:
            return got, exc
        return got, None

    got, error = asyncio.run(run())
    assert got == ["0", "1", "2"] and str(error) == "engine died"


def test_get_final_waits_for_the_finish() -> None:
    async def run() -> Delta:
        stream = OutputStream()
        waiter = asyncio.create_task(stream.get_final())
        stream.put(delta("a", [1], 1))
        await asyncio.sleep(0)
        assert not waiter.done()
        stream.put(delta("b", [2], 2, "stop"))
        return await waiter

    final = asyncio.run(run())
    assert final.text == "ab" and final.finished


def _stream_text(tokenizer: Tokenizer, ids: list[int], stop: tuple[str, ...],
                 min_tokens: int = 0) -> tuple[list[str], str | None, str]:
    params = SamplingParams(max_tokens=len(ids), stop=stop, min_tokens=min_tokens)
    text = RequestText(tokenizer, [5, 6], params)
    pieces: list[str] = []
    stopped = None
    for i, t in enumerate(ids):
        piece, stopped = text.add([t], i == len(ids) - 1)
        pieces.append(piece)
        if stopped:
            break
    return pieces, stopped, text.text


def test_stop_strings_cut_the_text_and_never_take_back_streamed_text(
    tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog", False)
    pieces, stopped, text = _stream_text(tokenizer, ids, ("fox jumps",))
    assert stopped == "fox jumps"
    assert "".join(pieces) == text == "The quick brown "
    no_stop, none, full = _stream_text(tokenizer, ids, ())
    assert none is None and "".join(no_stop) == full == tokenizer.decode(ids)
    # released text never runs ahead into a stop string that completes later
    held, _, _ = _stream_text(tokenizer, ids, ("lazy dog",))
    released = ""
    for piece in held:
        released += piece
        assert "lazy dog".startswith(released[len("The quick brown fox jumps over the "):]) \
            or len(released) <= len("The quick brown fox jumps over the ")


def test_stop_strings_wait_for_min_tokens(tokenizer: Tokenizer) -> None:
    """As vLLM: no stop string ends a request before ``min_tokens`` outputs (one completed
    earlier is not looked for again)."""
    ids = tokenizer.encode("Hello world! Hello world!", False)
    first = len(tokenizer.encode("Hello world!", False))
    assert tokenizer.encode("Hello world!", False) == ids[:first]
    _, early, text = _stream_text(tokenizer, ids, ("world",))
    assert early == "world" and text == "Hello "
    _, late, text = _stream_text(tokenizer, ids, ("world",), min_tokens=first)
    assert late == "world" and text == "Hello world! Hello "


def test_wire_messages_round_trip() -> None:
    codec = Codec()
    params = SamplingParams(max_tokens=5, temperature=0.5, stop=("x",), seed=3)
    for message in (AddRequest("0-1", [1, 2, 3], params, 1.5, 2, priority=1),
                    AbortRequests(["0-1", "0-2"])):
        assert codec.decode_client(codec.encode(message)) == message
    timing = RequestTiming(1.0, 1.1, 1.2, 1.9, 0)
    stats = SchedulerStats(3, 1, 0.25, 64, 32, 0)
    for reply in (
        EngineReady(0, EngineInfo(1024, 384, 512, 16, "cpu")),
        EngineOutputs(0, 7, 2.0, [RequestUpdate("0-1", [9], "stop", 2, timing)], stats),
        EngineOutputs(0, -1, 2.0, [RequestUpdate("0-2", [], "error", error="bad")]),
    ):
        assert codec.decode_engine(codec.encode(reply)) == reply
    with pytest.raises(Exception, match="max_tokens"):
        codec.decode_client(codec.encode(AddRequest("r", [1], params, 0.0, 0)).replace(
            b"\xaamax_tokens\x05", b"\xaamax_tokens\x00"))


def test_engine_stats_come_from_the_event_log() -> None:
    log = EventLog()
    tracker = EngineStatsTracker(log)
    tracker.add("a", 40)
    log.record("a", EventKind.ENGINE_ENQUEUED, 1.0)
    log.record("a", EventKind.SCHEDULED, 1.5, 32)
    log.record("a", EventKind.FIRST_TOKEN, 2.0)
    log.record("a", EventKind.PREEMPTED, 2.5)
    tracker.scan()  # the engine scans each iteration's events before counting its outputs
    tracker.count_tokens("a", 3)
    log.record("a", EventKind.SCHEDULED, 3.0, 0)
    tracker.scan()
    stats = tracker.stats(1, 0, 0.5)
    assert stats == SchedulerStats(1, 0, 0.5, 40 + 43, 32, 1)
    assert tracker.stats(1, 0, 0.5) is None  # nothing new
    timing = tracker.finish("a", 4.0)
    assert timing == RequestTiming(1.0, 1.5, 2.0, 4.0, 1)
    assert tracker.finish("a", 5.0) is None


def test_joined_log_puts_every_process_on_one_timeline(tmp_path: Path) -> None:
    """Two API servers' and one engine's records become one log: requests in arrival order,
    time 0 = first arrival, a step delivered when its last token reached a client."""
    engine_log = EventLog()
    for req_id, t in (("1-0", 10.02), ("0-0", 10.03)):
        engine_log.record(req_id, EventKind.ENGINE_ENQUEUED, t)
        engine_log.record(req_id, EventKind.SCHEDULED, t + 0.01, 0)
    engine_log.record_step(StepRecord(0, 10.04, 10.04, 10.05, 10.05, 2, 8, 2, 8, 0, 0, 2, 2, 0, 0,
                                      0, 2, 0, 0.1, "", 0.01, 0))
    for req_id in ("1-0", "0-0"):
        engine_log.record(req_id, EventKind.FIRST_TOKEN, 10.05)
        engine_log.record_token(req_id, 0)
        engine_log.record(req_id, EventKind.FINISHED, 10.05, "length")
        engine_log.close_request(req_id)
    apis = []
    for index, (req_id, arrival, sent) in enumerate((("0-0", 10.01, 10.07),
                                                     ("1-0", 10.0, 10.06))):
        rec = APIServerRecord(index)
        for kind, t in ((EventKind.ARRIVAL, arrival), (EventKind.FRONTEND_START, arrival),
                        (EventKind.TOKENIZED, arrival + 0.005), (EventKind.DELIVERED, sent)):
            rec.req_ids.append(req_id)
            rec.kinds.append(int(kind))
            rec.times_s.append(t)
            rec.payloads.append(4 if kind == EventKind.ARRIVAL else None)
        rec.step_delivered_s[(0, 0)] = sent
        apis.append(rec)
    engine = EngineRecord(0, engine_log.export(), 1024, 64, "cpu")
    joined = joined_log(ServedRecords(engine, apis))
    assert joined["req_ids"] == ["1-0", "0-0"]
    assert joined["delivered"] == {"step_id": [0], "time_s": [pytest.approx(0.07)]}
    req = build_tables(ExportedLog(joined)).requests
    assert req["arrival_s"].tolist() == pytest.approx([0.0, 0.01])
    assert req["ttft_s"].tolist() == pytest.approx([0.07, 0.06])
    assert req["engine_enqueued_s"].tolist() == pytest.approx([0.02, 0.03])
    assert req["success"].all() and not math.isnan(req["seg_ipc_in_s"].iloc[0])
