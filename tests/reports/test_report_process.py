"""The report process (``reports/report_process.py``) writes the very run directory the
in-process path writes, reports its errors the same way, and steps aside when it should."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from array import array
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from engine.core.events import EventLog
from reports.errors import ReportError
from reports.options import SummaryOptions
from reports.report_process import ReportProcess, _serve, recv_export, send_export
from sim.config import SimConfig
from sim.runtime import run_simulation

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["simulate", "--no-plots", "--no-progress", "--dataset-name", "random",
        "--num-prompts", "60", "--request-rate", "20", "--random-input-len", "300",
        "--random-output-len", "20", "--seed", "5"]
OPTIONS = SummaryOptions(goodput=None, percentiles=(99.0,),
                         percentile_metrics=("ttft", "tpot", "itl"))


def _simulate(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "experiments.cli", *ARGS, "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env}, check=True,
    )


def test_a_fresh_cli_writes_the_same_run_directory_through_it(tmp_path: Path) -> None:
    forked = _simulate(tmp_path / "forked")
    local = _simulate(tmp_path / "local", TWINSERVE_REPORT_PROCESS="0")
    assert forked.stdout == local.stdout and "Serving Benchmark Result" in forked.stdout
    for name in ("requests", "steps", "token_runs"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "forked" / f"{name}.parquet"),
                                      pd.read_parquet(tmp_path / "local" / f"{name}.parquet"))
    summaries = [json.loads((tmp_path / d / "summary.json").read_text())
                 for d in ("forked", "local")]
    for s in summaries:
        s.pop("date")
    assert summaries[0] == summaries[1]
    assert sorted(p.name for p in (tmp_path / "forked").iterdir()) == sorted(
        p.name for p in (tmp_path / "local").iterdir())


def test_it_steps_aside_where_it_cannot_help(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "pandas" in sys.modules  # this test session: the report stack is here already
    assert ReportProcess.start() is None
    monkeypatch.setenv("TWINSERVE_REPORT_PROCESS", "0")
    assert ReportProcess.start() is None


class _Thread:
    """A thread standing in for the forked process (same protocol, same code)."""

    def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
        self._thread = threading.Thread(target=target, args=args, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def terminate(self) -> None:
        raise AssertionError("the report thread should have ended")


def _reporter() -> ReportProcess:
    ours, theirs = Pipe()
    return ReportProcess(_Thread(_serve, (theirs,)), ours)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def small_run() -> Any:
    return run_simulation(SimConfig.from_dict({"workload": {
        "dataset_name": "random", "num_prompts": 20, "request_rate": 50.0,
        "random_input_len": 64, "random_output_len": 8}}))


def test_it_returns_the_summary_and_its_printed_form(small_run: Any, tmp_path: Path) -> None:
    from reports.metrics import format_summary

    written = _reporter().write(small_run.event_log, {"kind": "simulated"}, tmp_path, OPTIONS,
                                plots=False, file_format="csv")
    assert written is not None
    files, text = written
    summary = files.summary
    assert text == format_summary(summary) and summary["completed"] == 20
    assert (tmp_path / "requests.csv").exists() and (tmp_path / "summary.json").exists()


def test_a_report_error_is_raised_as_in_process(small_run: Any, tmp_path: Path) -> None:
    bad = dataclasses.replace(OPTIONS, goodput={"nonsense": 1.0})
    with pytest.raises(ReportError, match="nonsense"):
        _reporter().write(small_run.event_log, {"kind": "simulated"}, tmp_path, bad,
                          plots=False, file_format="csv")


def test_any_other_failure_leaves_the_report_to_the_caller(small_run: Any,
                                                            tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert _reporter().write(small_run.event_log, {"kind": "simulated"}, a_file, OPTIONS,
                             plots=False, file_format="csv") is None


def test_the_log_crosses_the_pipe_unchanged(small_run: Any) -> None:
    """Its typed arrays travel as raw bytes, the rest pickled, a column at a time: what arrives
    equals what was exported, array types included, and the sent export is emptied."""
    sent = small_run.event_log.export()
    ours, theirs = Pipe()
    sender = threading.Thread(target=send_export, args=(ours, sent))
    sender.start()  # the bytes may exceed the pipe's buffer: the receiver reads meanwhile
    received = recv_export(theirs)
    sender.join()
    exported = small_run.event_log.export()
    assert received == exported and sent == {}
    arrays = [(name, col.typecode) for name, col in exported["steps"].items()
              if hasattr(col, "typecode")]
    assert arrays and all(received["steps"][n].typecode == code for n, code in arrays)
    assert type(received["steps"]["admission_blocker"]) is list


def test_columns_of_any_size_cross_whole_and_a_cut_one_is_an_eof() -> None:
    """A typed column's bytes go raw over the connection's descriptor, between its framed
    messages: an empty column, one far larger than the socket's buffer (the receiver reads
    while the sender writes) and the framed message after them all arrive intact; a column
    cut short by the sender's end is an ``EOFError``, not a short column."""
    big = array("d", (i * 0.5 for i in range(1_500_000)))  # 12 MB
    sent = {"steps": {"empty": array("q"), "big": big, "ints": array("i", [3, -1])},
            "req_ids": ["a", "b"]}
    expected = {"steps": {name: array(c.typecode, c) for name, c in sent["steps"].items()},
                "req_ids": ["a", "b"]}
    ours, theirs = Pipe()
    sender = threading.Thread(target=send_export, args=(ours, sent))
    sender.start()
    received = recv_export(theirs)
    sender.join()
    assert received == expected
    assert [c.typecode for c in received["steps"].values()] == ["q", "d", "i"]
    received["steps"]["big"].append(1.0)  # no view of it outlives the read: it can grow
    ours.send(("after", 1))
    assert theirs.recv() == ("after", 1)

    ours, theirs = Pipe()
    ours.send([("steps", ["cut"])])
    ours.send(("array", "q", 100))  # 100 values announced, 1 sent
    os.write(ours.fileno(), bytes(8))
    ours.close()
    with pytest.raises(EOFError):
        recv_export(theirs)


def test_on_sent_runs_once_per_column_as_the_export_empties(small_run: Any) -> None:
    """``on_sent`` (where the run returns a handed-over log's pages to the system) runs once
    per column sent, the export shrinking to nothing meanwhile."""
    sent = small_run.event_log.export()
    columns = [(key, name) for key, value in sent.items()
               for name in (value if isinstance(value, dict) else [None])]
    held: list[int] = []

    def on_sent() -> None:
        held.append(sum(len(v) if isinstance(v, dict) else 1 for v in sent.values()))

    ours, theirs = Pipe()
    sender = threading.Thread(target=send_export, args=(ours, sent), kwargs={"on_sent": on_sent})
    sender.start()
    received = recv_export(theirs)
    sender.join()
    assert received == small_run.event_log.export()
    assert len(held) == len(columns) and held[-1] == 0
    assert held == sorted(held, reverse=True)  # the export only shrinks


needs_memfd = pytest.mark.skipif(not hasattr(os, "memfd_create"),
                                 reason="no memory files (memfd_create) on this system")


def _across_a_memory_file(sent: dict[str, Any]) -> dict[str, Any]:
    from reports.report_process import _shared_file

    fd = _shared_file()
    assert fd is not None
    try:
        ours, theirs = Pipe()
        sender = threading.Thread(target=send_export, args=(ours, sent),
                                  kwargs={"shared_fd": fd})
        sender.start()
        received = recv_export(theirs, fd)
        sender.join()
    finally:
        os.close(fd)  # the columns' mappings outlive the file's descriptor
    return received


@needs_memfd
def test_columns_placed_in_a_memory_file_arrive_mapped_and_equal(small_run: Any) -> None:
    """With a memory file, each non-empty typed column is written there and mapped by the
    receiver — a read-only numpy array of the column's own type over the mapping, no copy —
    while lists and empty columns still travel over the connection."""
    import mmap

    import numpy as np

    exported = small_run.event_log.export()
    received = _across_a_memory_file(small_run.event_log.export())
    mapped = 0
    for key, part in exported.items():
        columns = part.items() if isinstance(part, dict) else [(None, part)]
        got = received[key]
        for name, col in columns:
            value = got if name is None else got[name]
            if isinstance(col, array) and len(col):
                mapped += 1
                assert isinstance(value, np.ndarray)
                assert isinstance(getattr(value.base, "obj", None), mmap.mmap)  # no copy
                assert value.dtype == np.dtype(col.typecode) and not value.flags.writeable
                assert value.tolist() == col.tolist()
            else:
                assert value == col and type(value) is type(col)
    assert mapped >= 20


@needs_memfd
def test_tables_built_from_mapped_columns_equal_those_built_from_the_log(
        small_run: Any) -> None:
    from reports.tables import ExportedLog, build_tables

    received = _across_a_memory_file(small_run.event_log.export())
    mapped = build_tables(ExportedLog(received, owned=True))
    direct = build_tables(small_run.event_log)
    for name in ("requests", "steps", "token_runs"):
        pd.testing.assert_frame_equal(getattr(mapped, name), getattr(direct, name))


def test_a_mapped_column_without_the_memory_file_is_refused() -> None:
    ours, theirs = Pipe()
    ours.send([("steps", ["step_id"])])
    ours.send(("mapped", "q", 4, 0))
    with pytest.raises(ValueError, match="memory file"):
        recv_export(theirs)


@needs_memfd
def test_a_run_directory_from_mapped_columns_is_the_same_and_the_file_is_closed(
        tmp_path: Path) -> None:
    """The report written from columns mapped out of the memory file is byte for byte the
    one written from columns sent down the connection, and closing the reporter closes the
    file (each end closes its own descriptor: here a thread stands in, with a duplicate)."""
    from reports.report_process import _shared_file

    meta = {"kind": "simulated", "date": "20261201-000000"}
    log = _simulated().event_log
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    piped = _reporter().write(log, meta, tmp_path / "a", OPTIONS, plots=False,
                              file_format="parquet")
    fd = _shared_file()
    assert fd is not None
    ours, theirs = Pipe()
    reporter = ReportProcess(_Thread(_serve, (theirs, None, None, os.dup(fd))),  # type: ignore[arg-type]
                             ours, fd)
    mapped = reporter.write(log, meta, tmp_path / "b", OPTIONS, plots=False,
                            file_format="parquet")
    assert piped is not None and mapped is not None
    assert mapped[1] == piped[1] and mapped[0].summary == piped[0].summary
    for name in ("requests", "steps", "token_runs"):
        assert (tmp_path / "a" / f"{name}.parquet").read_bytes() == (
            tmp_path / "b" / f"{name}.parquet").read_bytes()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with the reporter


def _simulated(num_prompts: int = 30) -> Any:
    return run_simulation(SimConfig.from_dict({"workload": {
        "dataset_name": "random", "num_prompts": num_prompts, "request_rate": 50.0,
        "random_input_len": 64, "random_output_len": 8}}))


def test_a_long_log_is_handed_over_and_written_the_same(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_STEPS_COPIED`` steps the log is moved out of the run (left empty), sent
    column by column, and written exactly as a copied one."""
    import reports.report_process as rp

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    meta = {"kind": "simulated", "date": "20261201-000000"}  # not the clock's second
    copied = _reporter().write(_simulated().event_log, meta, tmp_path / "a",
                               OPTIONS, plots=False, file_format="parquet")
    monkeypatch.setattr(rp, "MAX_STEPS_COPIED", 0)
    log = _simulated().event_log
    handed = _reporter().write(log, meta, tmp_path / "b", OPTIONS,
                               plots=False, file_format="parquet")
    assert copied is not None and handed is not None
    assert log.num_steps == 0 and log.req_ids == []  # the run kept none of it
    assert handed[1] == copied[1] and handed[0].summary == copied[0].summary
    for name in ("requests", "steps", "token_runs"):
        assert (tmp_path / "a" / f"{name}.parquet").read_bytes() == (
            tmp_path / "b" / f"{name}.parquet").read_bytes()


def _dies_after_the_log(conn: Any) -> None:
    conn.send(("ready", None))
    conn.recv()
    recv_export(conn)
    conn.close()


def test_a_process_lost_after_the_handover_is_an_error_not_a_silent_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the log handed over there is nothing left to write in-process: say so."""
    import reports.report_process as rp

    monkeypatch.setattr(rp, "MAX_STEPS_COPIED", 0)
    ours, theirs = Pipe()
    reporter = ReportProcess(_Thread(_dies_after_the_log, (theirs,)), ours)  # type: ignore[arg-type]
    with pytest.raises(ReportError, match="TWINSERVE_REPORT_PROCESS=0"):
        reporter.write(_simulated().event_log, {"kind": "simulated"}, tmp_path, OPTIONS,
                       plots=False, file_format="csv")


class _Process:
    """Records what ``close`` does to the process."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def join(self, timeout: float | None = None) -> None:
        self.calls.append("join")

    def is_alive(self) -> bool:
        return False

    def terminate(self) -> None:
        self.calls.append("terminate")


def test_a_process_left_without_a_log_is_terminated_at_once() -> None:
    """If the run fails or is interrupted, the report process is not waited for."""
    ours, _theirs = Pipe()
    process = _Process()
    ReportProcess(process, ours).close()  # type: ignore[arg-type]
    assert process.calls == ["terminate", "join"]


def test_write_run_turns_a_report_error_into_a_user_error(small_run: Any,
                                                           tmp_path: Path) -> None:
    """Whichever writer runs, the CLI's tail reports a bad option as one ``UserError``."""
    import argparse

    from engine.core.errors import UserError
    from experiments.cli.reporting import FinishedRun, open_out_dir, write_run
    from experiments.run_meta import simulated_run_meta

    bad = dataclasses.replace(OPTIONS, goodput={"nonsense": 1.0})
    args = argparse.Namespace(no_plots=True, format="csv")
    for reporter in (_reporter(), None):
        log = EventLog.from_export(small_run.event_log.export())  # write_run takes its log
        run = FinishedRun(simulated_run_meta(small_run), log)
        with pytest.raises(UserError, match="nonsense"), open_out_dir(tmp_path / "o") as out:
            write_run(run, out, args, bad, reporter)
        assert list(tmp_path.iterdir()) == []  # nothing half-written is left


def test_the_forked_process_writes_with_the_system_allocator() -> None:
    """pyarrow reads ``ARROW_DEFAULT_MEMORY_POOL`` once, when it first allocates: the forked
    process sets it before it imports pyarrow, which the run that forks it has not imported
    (its imports up to the fork are those below); a value the user exported is kept."""
    code = (
        "import sys, experiments.cli.cmd_sim, experiments.cli.reporting, sim.runtime\n"
        "assert 'pyarrow' not in sys.modules\n"
        "from reports.report_process import _use_system_allocator_for_arrow\n"
        "_use_system_allocator_for_arrow()\n"
        "import pyarrow\n"
        "print(pyarrow.default_memory_pool().backend_name)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    for exported, backend in ((None, "system"), ("mimalloc", "mimalloc")):
        run_env = env if exported is None else {**env, "ARROW_DEFAULT_MEMORY_POOL": exported}
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                             text=True, env=run_env, check=True).stdout
        assert out.strip() == backend


def test_the_forked_process_imports_without_collections_then_freezes() -> None:
    """The report stack is imported with the collector off (no collection runs), then what
    the process holds is frozen and the collector is back on, even when an import fails;
    anywhere but the forked process (``forked`` false) the collector is left alone. In a
    fresh interpreter: freezing is for the whole process."""
    code = (
        "import gc, sys\n"
        "from reports.report_process import _no_collections_while_importing as quiet\n"
        "runs = []\n"
        "gc.callbacks.append(lambda phase, info: runs.append(phase))\n"
        "with quiet(False):\n"
        "    assert gc.isenabled()\n"
        "assert gc.get_freeze_count() == 0\n"
        "with quiet(True):\n"
        "    assert not gc.isenabled()\n"
        "    import pandas, pyarrow.parquet\n"
        "assert runs == [] and gc.isenabled()\n"
        "frozen = gc.get_freeze_count()\n"
        "assert frozen > 10_000, frozen\n"
        "try:\n"
        "    with quiet(True):\n"
        "        raise ImportError('a report module is broken')\n"
        "except ImportError:\n"
        "    pass\n"
        "assert gc.isenabled()\n"
        "gc.disable()\n"
        "with quiet(True):\n"
        "    pass\n"
        "assert not gc.isenabled()  # a collector the process had turned off stays off\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "ok"
