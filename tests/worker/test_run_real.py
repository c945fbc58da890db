"""``twinserve run-real`` on the tiny model: it completes a small workload and writes a run
directory with the same structure as a simulated one."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from reports.run_dir import load_run_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    assert main(["make-tiny-model", str(d)]) == 0
    return d


def test_run_real_matches_the_simulated_run_directory(tiny: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    real, sim = tmp_path / "real", tmp_path / "sim"
    workload = ["--dataset-name", "random", "--num-prompts", "12", "--random-input-len", "48",
                "--random-output-len", "8", "--request-rate", "40", "--random-prefix-len", "16"]
    assert main(["run-real", "--model", str(tiny), "--kv-cache-memory", "2MiB", "--no-plots",
                 "--out", str(real), "--async-scheduling", *workload]) == 0
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out
    assert "Successful requests:                     12" in out
    assert main(["simulate", "--no-plots", "--out", str(sim), *workload]) == 0
    real_meta, real_tables = load_run_dir(real)
    sim_meta, sim_tables = load_run_dir(sim)
    assert real_meta["kind"] == "real" and sim_meta["kind"] == "simulated"
    assert sorted(p.name for p in real.iterdir()) == sorted(p.name for p in sim.iterdir())
    for name in ("requests", "steps", "token_runs"):
        assert list(getattr(real_tables, name).columns) == list(getattr(sim_tables, name).columns)
    import json

    real_summary = json.loads((real / "summary.json").read_text())
    sim_summary = json.loads((sim / "summary.json").read_text())
    assert set(real_summary) == set(sim_summary)
    assert real_summary["completed"] == 12 and real_summary["total_output_tokens"] == 12 * 8
    # the shared 16-token prefix was hit by later requests
    assert real_tables.requests.prefix_hit_tokens.sum() > 0


def test_run_real_never_imports_the_simulator(tiny: Path, tmp_path: Path) -> None:
    """The real world takes its workload from ``workload``: a measured run loads no ``sim``."""
    import subprocess
    import sys

    code = (
        "import sys; from experiments.cli import main; "
        f"rc = main(['run-real', '--model', {str(tiny)!r}, '--kv-cache-memory', '2MiB', "
        f"'--no-plots', '--out', {str(tmp_path / 'run')!r}, '--dataset-name', 'random', "
        "'--num-prompts', '3', '--random-input-len', '16', '--random-output-len', '2']); "
        "print(rc, sorted(m for m in sys.modules if m == 'sim' or m.startswith('sim.')))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"


def test_a_measured_run_is_described_as_a_simulated_one_is(tiny: Path, tmp_path: Path) -> None:
    """The same record: the run's span is stats.duration_s, the knobs are config.engine."""
    import json

    assert main(["run-real", "--model", str(tiny), "--kv-cache-memory", "2MiB", "--no-plots",
                 "--out", str(tmp_path), "--dataset-name", "random", "--num-prompts", "4",
                 "--random-input-len", "16", "--random-output-len", "2"]) == 0
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["kind"] == "real" and "gpu" not in meta and meta["device"] == "cpu"
    assert 0 < meta["stats"]["duration_s"] <= meta["stats"]["wall_time_s"]
    assert "simulated_time_s" not in meta["stats"]
    assert meta["config"]["engine"]["async_scheduling"] is False
    assert "max_num_seqs" in meta["config"]["engine"]
    assert "max_num_seqs" not in meta["config"]["engine_args"]
    assert meta["config"]["workload"]["num_prompts"] == 4
