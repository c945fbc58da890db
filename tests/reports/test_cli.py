"""``twinserve report`` and ``twinserve compare`` through ``experiments.cli.main``."""

from __future__ import annotations

import pytest

import experiments.cli as cli
from reports.meta import read_json
from reports.run_dir import write_run_dir
from tests.reports.logs import known_log


@pytest.fixture(autouse=True)
def with_report_commands(monkeypatch):
    if "experiments.cli.cmd_reports" not in cli.COMMAND_MODULES:
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES,
                                                     "experiments.cli.cmd_reports"))


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    write_run_dir(d, known_log(), {"kind": "real", "config": {"model": "m"}}, plots=False)
    return d


def test_report_rebuilds_from_files(run_dir, capsys):
    rc = cli.main(["report", str(run_dir), "--goodput", "ttft:2000", "e2el:5000",
                   "--metric-percentiles", "50,90,99", "--percentile-metrics",
                   "ttft,tpot,itl,e2el", "--no-plots"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Serving Benchmark Result" in out and "P90 E2EL (ms):" in out
    assert "Request goodput (req/s):" in out and "Diagnosis:" in out
    s = read_json(run_dir / "summary.json")
    assert s["goodput_slos_ms"] == {"ttft": 2000.0, "e2el": 5000.0}
    assert s["request_goodput"] == pytest.approx(0.0)  # c meets ttft, not e2el
    assert s["backend"] == "twinserve" and s["kind"] == "real"


@pytest.mark.parametrize("argv, message", [
    (["--goodput", "ttft=30"], "KEY:VALUE"),
    (["--goodput", "ttfb:30"], "valid names are ttft, tpot, e2el"),
    (["--goodput", "ttft:-1"], "positive number"),
    (["--goodput", "e2el:0"], "no request meets a limit of 0 ms"),
    (["--goodput", "ttft:100", "ttft:200"], "goodput SLO 'ttft' given twice ('ttft:200')"),
    (["--metric-percentiles", "50,abc"], "comma-separated numbers"),
    (["--percentile-metrics", "ttft,foo"], "valid names are ttft, tpot, itl, e2el"),
])
def test_bad_flags_end_in_one_line(run_dir, capsys, argv, message):
    rc = cli.main(["report", str(run_dir), "--no-plots", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("twinserve: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_missing_run_dir(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare(run_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = cli.main(["compare", str(run_dir), str(run_dir), "--out", str(out), "--labels",
                   "sim,real", "--no-plots"])
    assert rc == 0 and "baseline sim" in capsys.readouterr().out
    assert read_json(out / "compare.json")["baseline"] == "sim"
    assert cli.main(["compare", str(run_dir), str(run_dir), "--out", str(out),
                     "--labels", "one"]) == 2


def test_save_detailed_adds_per_request_arrays(run_dir):
    assert cli.main(["report", str(run_dir), "--save-detailed", "--no-plots"]) == 0
    s = read_json(run_dir / "summary.json")
    assert s["itls"][1] == pytest.approx([1.0, 3.0, 1.0]) and len(s["latencies"]) == 4
    assert cli.main(["report", str(run_dir), "--no-plots"]) == 0  # the choice is kept
    assert "itls" in read_json(run_dir / "summary.json")
