"""``twinserve bench serve`` against real servers: ``twinserve serve`` on a tiny checkpoint and
``twinserve serve --emulate``. Each run's result JSON must satisfy what vLLM's readers take
(``tests/loadgen/reader.py``), its table must be vllm's, and the requests the server saw must be
the stream ``twinserve simulate`` builds from the same flags."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.cli import main
from reports.run_dir import load_run_dir
from tests.loadgen.reader import DETAIL_KEYS, read_result
from tests.serve.conftest import TINY_FLAGS, stop_and_check
from tests.serve.server import ServerProcess
from workload.build import build_workload
from workload.config import WorkloadConfig

WORKLOAD = ["--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8",
            "--random-range-ratio", "0.5", "--num-prompts", "24", "--request-rate", "40",
            "--seed", "3"]
TABLE_HEAD = "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")


def table_lines(text: str) -> list[str]:
    start = text.index(TABLE_HEAD)
    end = text.index("=" * 50 + "\n", start + len(TABLE_HEAD)) + 50
    return text[start:end].splitlines()


def check_table(lines: list[str], result: dict) -> None:
    """The printed table is vllm's layout with the result's numbers."""
    assert lines[0] == TABLE_HEAD and lines[-1] == "=" * 50
    assert lines[1] == "{:<40} {:<10}".format("Successful requests:", result["completed"])
    assert "{:<40} {:<10.2f}".format("Benchmark duration (s):", result["duration"]) in lines
    assert "{:<40} {:<10.2f}".format("Median TTFT (ms):", result["median_ttft_ms"]) in lines
    assert all(re.fullmatch(r"[-=]+.*[-=]+|.{40} \S.*", line) for line in lines)


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """A tiny-model server with a record directory, stopped at the end of the module."""
    record_dir = tmp_path_factory.mktemp("records") / "served"
    server = ServerProcess("--model", str(tiny_model), *TINY_FLAGS, "--record-dir",
                           str(record_dir), "--no-plots")
    try:
        yield server, record_dir
    finally:
        if server.proc.poll() is None:
            stop_and_check(server)


def test_bench_serve_against_twinserve_serve(served, tiny_model: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = served
    run = tmp_path / "run"
    assert main(["bench", "serve", "--base-url", server.url, "--model", str(tiny_model),
                 *WORKLOAD, "--save-result", "--save-detailed", "--result-dir",
                 str(tmp_path / "results"), "--percentile-metrics", "ttft,tpot,itl,e2el",
                 "--metric-percentiles", "50,90,99", "--out", str(run), "--no-plots",
                 "--disable-tqdm", "--request-id-prefix", "served-"]) == 0
    text = capsys.readouterr().out
    files = list((tmp_path / "results").glob("openai-40.0qps-*.json"))
    assert len(files) == 1, files
    result = read_result(files[0])
    assert set(DETAIL_KEYS) <= set(result)
    check_table(table_lines(text), result)
    # the identical stream: the simulator's workload of the same flags
    w = build_workload(WorkloadConfig(dataset_name="random", random_input_len=32,
                                      random_output_len=8, random_range_ratio=0.5,
                                      num_prompts=24, request_rate=40.0, seed=3))
    assert result["completed"] == 24 and result["failed"] == 0
    assert result["input_lens"] == w.prompt_lens.tolist()  # the server's own counts (usage)
    assert result["output_lens"] == w.output_lens.tolist()
    sends = np.array(result["start_times"]) - result["start_times"][0]
    assert np.abs(sends - (w.send_time_s - w.send_time_s[0])).max() < 0.05
    # the client-only run directory reads back, with the client's times
    meta, tables = load_run_dir(run)
    assert meta["steps"].startswith("client chunks")
    assert tables.requests["num_prompt_tokens"].tolist() == w.prompt_lens.tolist()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["median_ttft_ms"] == pytest.approx(result["median_ttft_ms"])
    assert summary["completed"] == 24
    client = pd.read_parquet(run / "client_requests.parquet")
    assert client["request_id"].tolist() == [f"served-{i}" for i in range(24)]
    assert meta["config"]["workload"]["seed"] == 3


def test_chat_backend_and_sharegpt(served, tiny_model: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = served
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": f"Tell me about topic {i} " * (i + 2)},
                           {"from": "gpt", "value": "It is a topic. " * (i + 1)}]}
        for i in range(6)] + [{"conversations": [{"from": "human", "value": "alone"}]}]))
    flags = ["--base-url", server.url, "--model", str(tiny_model), "--dataset-name", "sharegpt",
             "--dataset-path", str(sharegpt), "--num-prompts", "8", "--request-rate", "inf",
             "--sharegpt-output-len", "5", "--ignore-eos", "--no-plots", "--disable-tqdm",
             "--save-result", "--result-filename", str(tmp_path / "r.json"), "--save-detailed"]
    assert main(["bench", "serve", *flags, "--out", str(tmp_path / "a")]) == 0
    result = read_result(tmp_path / "r.json")
    w = build_workload(WorkloadConfig(dataset_name="sharegpt", dataset_path=str(sharegpt),
                                      tokenizer=str(tiny_model), num_prompts=8,
                                      sharegpt_output_len=5))
    assert result["input_lens"] == w.prompt_lens.tolist()  # text re-tokenized by the server
    assert result["output_lens"] == [5] * 8
    assert main(["bench", "serve", *flags, "--backend", "openai-chat", "--endpoint",
                 "/v1/chat/completions", "--out", str(tmp_path / "b")]) == 0
    chat = read_result(tmp_path / "r.json")
    assert chat["completed"] == 8 and chat["backend"] == "openai-chat"
    assert all(n > m for n, m in zip(chat["input_lens"], w.prompt_lens, strict=True))  # template
    capsys.readouterr()


def test_ramp_up_sends_the_simulated_arrivals_and_logs_rate_changes(
        served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = served
    flags = ["--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "2",
             "--num-prompts", "12", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "20",
             "--ramp-up-end-rps", "24", "--seed", "1"]
    assert main(["bench", "serve", "--base-url", server.url, *flags, "--save-result",
                 "--save-detailed", "--result-filename", str(tmp_path / "r.json"), "--out",
                 str(tmp_path / "run"), "--no-plots", "--disable-tqdm"]) == 0
    capsys.readouterr()
    result = read_result(tmp_path / "r.json")
    assert (result["ramp_up_strategy"], result["ramp_up_start_rps"],
            result["ramp_up_end_rps"]) == ("linear", 20.0, 24.0)
    assert [e["rps"] for e in result["rps_change_events"]] == [20, 21, 22, 23, 24]
    w = build_workload(WorkloadConfig(dataset_name="random", random_input_len=16,
                                      random_output_len=2, num_prompts=12, seed=1,
                                      ramp_up_strategy="linear", ramp_up_start_rps=20.0,
                                      ramp_up_end_rps=24.0))
    sends = np.array(result["start_times"]) - result["start_times"][0]
    assert np.abs(sends - (w.send_time_s - w.send_time_s[0])).max() < 0.05


def test_join_with_the_server_records_after_shutdown(served, tiny_model: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Stops the module's server: the last test that uses it."""
    server, record_dir = served
    run = tmp_path / "run"
    assert main(["bench", "serve", "--base-url", server.url, "--model", str(tiny_model),
                 *WORKLOAD, "--out", str(run), "--no-plots", "--disable-tqdm",
                 "--request-id-prefix", "joined-", "--continuous-usage-stats"]) == 0
    capsys.readouterr()
    stop_and_check(server)
    assert main(["bench", "join", str(run), "--server-record-dir", str(record_dir),
                 "--no-plots"]) == 0
    meta, tables = load_run_dir(run)
    assert meta["steps"] == "engine" and meta["clock_alignment"] == "shared clock"
    req = tables.requests
    assert req["req_id"].tolist() == [f"joined-{i}" for i in range(24)]
    assert req["success"].all()
    # every stage of the request path, in order, from the client's send on
    order = ["arrival_s", "frontend_start_s", "tokenized_s", "engine_enqueued_s", "scheduled_s",
             "first_token_s", "first_token_delivered_s"]
    assert (np.diff(req[order].to_numpy(), axis=1) >= 0).all()
    served_req = pd.read_parquet(run / "served_requests.parquet")
    assert served_req["req_id"].tolist() == req["req_id"].tolist()
    assert (served_req["engine_received_s"] >= req["tokenized_s"]).all()
    client = pd.read_parquet(run / "client_requests.parquet")
    # the run directory's TTFT is the client's (a step's delivery: its last chunk to arrive)
    assert np.allclose(req["ttft_s"], client["ttft_s"], atol=2e-3)
    assert (req["num_output_tokens"] == client["output_tokens"]).all()
    assert main(["report", str(run), "--no-plots"]) == 0
    sim = tmp_path / "sim"
    assert main(["simulate", *WORKLOAD, "--out", str(sim), "--no-plots"]) == 0
    assert main(["compare", str(run), str(sim), "--out", str(tmp_path / "cmp"),
                 "--no-plots"]) == 0
    capsys.readouterr()


def test_bench_serve_against_the_emulation_mode(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    server = ServerProcess("--emulate", "--model", "meta-llama/Llama-3.1-8B", "--gpu",
                           "h100-sxm", "--cost-model", "fixed:0.004")
    try:
        assert main(["bench", "serve", "--base-url", server.url, "--dataset-name", "trace",
                     "--dataset-path", "mooncake-synthetic", "--num-prompts", "12",
                     "--trace-time-scale", "20", "--max-concurrency", "4", "--save-result",
                     "--result-filename", str(tmp_path / "emu.json"), "--out",
                     str(tmp_path / "run"), "--no-plots", "--disable-tqdm",
                     "--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time"]) == 0
        text = capsys.readouterr().out
    finally:
        stop_and_check(server)
    result = read_result(tmp_path / "emu.json")
    assert result["completed"] == 12 and result["max_concurrency"] == 4
    assert result["request_rate"] == "inf"  # a trace replayed at its own times
    lines = table_lines(text)
    check_table(lines, result)
    assert "{:<40} {:<10}".format("Maximum request concurrency:", 4) in lines
    assert "{s:{c}^{n}}".format(s="Client-side Queueing", n=50, c="-") in lines
    w = build_workload(WorkloadConfig(dataset_name="trace", dataset_path="mooncake-synthetic",
                                      num_prompts=12, trace_time_scale=20.0, max_concurrency=4))
    assert result["total_input_tokens"] == int(w.prompt_lens.sum())
    assert (tmp_path / "run" / "summary.json").exists()
