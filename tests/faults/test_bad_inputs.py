"""Issue 18, classes 4-7: values checked before any work, in one ``twinserve: error:`` line,
results that are not silently wrong, and messages that say what is wrong.

Each case is a command line (run in-process, in a fresh directory with a few small files) that
must exit 2 with one error line containing the given words, having written no output. The
siblings of the issue's examples are here too: every command that takes the same kind of value.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from engine.core.sampling_params import SamplingParams
from experiments.cli import main
from workload.errors import WorkloadError
from workload.traces import parse_timestamps

SIM = ["simulate", "--dataset-name", "random", "--num-prompts", "4", "--random-input-len",
       "16", "--random-output-len", "4", "--no-plots", "--out", "out"]
TRACE_ROWS = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,32,8\n0.5,40,8\n"
_VALUES = ", ".join(str(i + 1) for i in range(10_000))
SWEEP_HUGE = f"""name = "huge"
[base.workload]
dataset_name = "random"
num_prompts = 10
[grid]
"workload.request_rate" = [{_VALUES}]
"workload.max_concurrency" = [{_VALUES}]
"""

CASES: dict[str, tuple[list[str], str]] = {
    # class 5: unchecked values
    "cpu-threads-huge": (["run-real", "--model", "m", "--cpu-threads", "100000"],
                         "--cpu-threads"),
    "cpu-threads-negative": (["run-real", "--model", "m", "--cpu-threads", "-1"],
                             "--cpu-threads"),
    "profile-cpu-threads": (["profile", "--model", "m", "--cpu-threads", "5000"],
                            "--cpu-threads"),
    "run-real-cpu-threads": (["run-real", "--model", "m", "--cpu-threads", "5000"],
                             "--cpu-threads"),
    "validate-loads-text": (["validate", "--model", "m", "--loads", "0.5,abc", "--out", "v"],
                            "--loads"),
    "validate-loads-negative": (["validate", "--model", "m", "--loads", "-0.5", "--out", "v"],
                                "--loads"),
    "num-prompts-beyond-memory": (["simulate", "--dataset-name", "random", "--num-prompts",
                                   "100000000", "--no-plots", "--out", "out"], "memory"),
    "out-is-a-file": ([*SIM[:-1], "afile"], "not a directory"),
    "compare-out-is-a-file": (["compare", "r1", "r2", "--out", "afile"], "afile"),
    "name-too-long": ([*SIM[:-1], "x" * 300], "too long"),
    "temperature-nan": (["generate", "--model", "m", "--prompt", "hi", "--temperature", "nan"],
                        "temperature"),
    "goodput-nan": ([*SIM, "--goodput", "ttft:nan"], "ttft"),
    # class 6: long silent waits and late refusals
    "sweep-dry-run-huge-grid": (["sweep", "huge.toml", "--dry-run"], "points"),
    # class 7: misleading messages
    "trace-is-a-fifo": (["simulate", "--dataset-name", "trace", "--dataset-path", "fifo",
                         "--no-plots", "--out", "out"], "FIFO"),
    "trace-is-dev-null": (["simulate", "--dataset-name", "trace", "--dataset-path",
                           "/dev/null", "--no-plots", "--out", "out"], "character device"),
    "trace-symlink-loop": (["simulate", "--dataset-name", "trace", "--dataset-path", "loop",
                            "--no-plots", "--out", "out"], "loop"),
    "trace-name-too-long": (["simulate", "--dataset-name", "trace", "--dataset-path",
                             "t" * 300 + ".csv", "--no-plots", "--out", "out"], "too long"),
    "mooncake-named-json": (["simulate", "--dataset-name", "trace", "--dataset-path",
                             "mc.json", "--no-plots", "--out", "out"], ".jsonl"),
    "generate-seed-negative": (["generate", "--model", "m", "--prompt", "hi", "--seed", "-1"],
                               "seed"),
    "generate-max-num-seqs-zero": (["generate", "--model", "m", "--prompt", "hi",
                                    "--max-num-seqs", "0"], "max-num-seqs"),
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "t.csv").write_text(TRACE_ROWS)
    (tmp_path / "huge.toml").write_text(SWEEP_HUGE)
    (tmp_path / "mc.json").write_text(
        '{"timestamp": 0, "input_length": 32, "output_length": 8, "hash_ids": [1]}\n')
    os.mkfifo(tmp_path / "fifo")
    os.symlink("loop", tmp_path / "loop")
    return tmp_path


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_in_one_line(workdir: Path, capsys: pytest.CaptureFixture[str],
                             name: str) -> None:
    argv, needle = CASES[name]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err
    lines = err.splitlines()  # one line, argparse's errors included
    assert len(lines) == 1 and lines[0].startswith("twinserve: error: "), err[-2000:]
    assert needle in lines[0], lines[0]
    assert not (workdir / "out").exists() and not (workdir / "v").exists()


def test_trace_with_byte_order_mark_reads(workdir: Path) -> None:
    (workdir / "bom.csv").write_bytes(b"\xef\xbb\xbf" + TRACE_ROWS.encode())
    assert main(["simulate", "--dataset-name", "trace", "--dataset-path", "bom.csv",
                 "--no-plots", "--out", "out"]) == 0


# class 4: silently wrong results
def test_azure_timestamps_keep_their_utc_offset(tmp_path: Path) -> None:
    stamps = ["2023-11-16 18:15:46.6805900+00:00", "2023-11-16 18:15:46.6805900-01:00",
              "2023-11-16 18:15:47.1805901Z"]
    got = parse_timestamps(stamps, tmp_path / "azure.csv")
    assert got[0] == 0.0
    assert got[1] == pytest.approx(3600.0, abs=1e-9)  # an hour later, not the same instant
    assert got[2] == pytest.approx(0.5000001, abs=1e-9)  # every fractional digit kept


def test_timestamps_without_an_offset_still_read(tmp_path: Path) -> None:
    got = parse_timestamps(["2023-11-16 18:15:46", "2023-11-16 18:15:46.25"], tmp_path / "a")
    np.testing.assert_allclose(got, [0.0, 0.25])


def test_bad_timestamp_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="bad TIMESTAMP"):
        parse_timestamps(["2023-11-16 18:15:46+1"], tmp_path / "azure.csv")


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5])
def test_sampling_temperature_must_be_finite(value: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=value)


def test_arrival_span_beyond_precision_refused(workdir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([*SIM[:-2], "--request-rate", "1e-10", "--out", "out"])
    err = capsys.readouterr().err
    assert rc == 2 and "precision" in err, err


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_all_rejected_is_not_healthy(workdir: Path, capsys: pytest.CaptureFixture[str],
                                     fmt: str) -> None:
    rc = main(["simulate", "--dataset-name", "random", "--num-prompts", "3",
               "--random-input-len", "200000", "--no-plots", "--format", fmt, "--out", "out"])
    out = capsys.readouterr().out
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert rc == 0, out
    assert summary["completed"] == 0
    assert summary["median_ttft_ms"] is None  # not a perfect 0 ms
    assert summary["diagnosis"]["verdict"] == "nothing-completed"
    # the report rebuilt from the tables (an empty CSV token_runs table included) agrees
    assert main(["report", "out", "--no-plots"]) == 0
    rebuilt = json.loads((workdir / "out" / "summary.json").read_text())
    assert rebuilt["diagnosis"]["verdict"] == "nothing-completed"


def test_a_short_trace_says_how_many_ran(workdir: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    assert main(["simulate", "--dataset-name", "trace", "--dataset-path", "t.csv",
                 "--num-prompts", "100", "--no-plots", "--out", "out"]) == 0
    assert "only 2 requests: all 2 ran" in capsys.readouterr().err
