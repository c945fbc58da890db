"""Sweeps: pure records, the result cache (a rerun with one added point runs only that
point), the process pool equal to in-process runs, the tidy table and the CLI."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from experiments.sweep.backends import InlineBackend, PoolBackend
from experiments.sweep.expfile import expand_points, parse_experiment
from experiments.sweep.report import run_experiment
from experiments.sweep.runner import ResultCache, cache_key, make_task, normalized, run_tasks
from tests.experiments.helpers import TINY_WORKLOAD

EXPERIMENT = f"""
name = "tiny"
[base]
[base.workload]
{chr(10).join(f"{k} = {json.dumps(v)}" for k, v in TINY_WORKLOAD.items())}
[grid]
"workload.request_rate" = [5, 20]
max_num_seqs = [4, 64]
[report]
goodput = ["ttft:100", "tpot:20"]
"""


def _spec(text: str = EXPERIMENT):  # type: ignore[no-untyped-def]
    return parse_experiment(tomllib.loads(text))


def _without_wall(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "wall_time_s"}


def test_cache_key_covers_config_and_report_options() -> None:
    (p, q, *_) = expand_points(_spec())
    report = {"goodput": {"ttft": 100.0}}
    key = cache_key(make_task(p.config, report))
    assert key == cache_key(make_task(dict(p.config), dict(report)))  # canonical, stable
    assert key == cache_key(make_task(p.config, report, run_dir="/elsewhere"))
    assert key != cache_key(make_task(q.config, report))
    assert key != cache_key(make_task(p.config, {"goodput": {"ttft": 200.0}}))
    assert len(key) == 64


def test_records_are_pure_and_flat(tmp_path: Path) -> None:
    (p, *_) = expand_points(_spec())
    task = make_task(p.config, {"goodput": {"ttft": 100.0}, "percentiles": [50, 99]})
    (a,), _ = run_tasks([task], InlineBackend(), ResultCache(None))
    (b,), _ = run_tasks([task], InlineBackend(), ResultCache(None))
    assert _without_wall(a) == _without_wall(b)
    assert all(not isinstance(v, (dict, list)) for v in a.values())
    assert a["workload.request_rate"] == 5.0 and a["engine.max_num_seqs"] == 4
    assert a["completed"] == 40 and a["num_gpus"] == 1
    for key in ("median_ttft_ms", "p99_tpot_ms", "request_goodput", "slo_attainment_all",
                "engine_prefix_cache_hit_rate", "wall_time_s", "sim_num_steps"):
        assert key in a, key


def test_rerun_with_one_added_point_runs_only_that_point(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    first = run_experiment(_spec(), out, InlineBackend(), plots=False)
    assert first.stats.num_run == 4 and first.stats.num_cached == 0
    assert len(list((out / "cache").glob("*.json"))) == 4
    again = run_experiment(_spec(), out, InlineBackend(), plots=False)
    assert again.stats.num_run == 0 and again.stats.num_cached == 4
    more = _spec(EXPERIMENT.replace("[5, 20]", "[5, 20, 40]"))
    third = run_experiment(more, out, InlineBackend(), plots=False)
    assert third.stats.num_run == 2 and third.stats.num_cached == 4  # 1 rate × 2 max_num_seqs
    one = _spec(EXPERIMENT.replace("[4, 64]", "[4, 64, 128]").replace("[5, 20]", "[5]"))
    fourth = run_experiment(one, out, InlineBackend(), plots=False)
    assert fourth.stats.num_run == 1 and fourth.stats.num_cached == 2
    cached = third.table.set_index("point")
    fresh = run_experiment(more, tmp_path / "fresh", InlineBackend(), plots=False)
    pd.testing.assert_frame_equal(
        cached.drop(columns="wall_time_s"),
        fresh.table.set_index("point").drop(columns="wall_time_s"),
    )
    redo = run_experiment(_spec(), out, InlineBackend(), resume=False, plots=False)
    assert redo.stats.num_run == 4


def test_table_plots_and_summary(tmp_path: Path) -> None:
    out = run_experiment(_spec(), tmp_path, InlineBackend())
    table = pd.read_parquet(tmp_path / "results.parquet")
    assert len(table) == 4 and list(table["point"]) == [0, 1, 2, 3]
    assert set(table["series"]) == {"max_num_seqs=4", "max_num_seqs=64"}
    assert {"axis:workload.request_rate", "axis:engine.max_num_seqs", "cache_key"} <= set(table)
    assert len(pd.read_csv(tmp_path / "results.csv")) == 4
    assert out.x == "request_rate" and (tmp_path / "plots" / "compare.png").stat().st_size > 0
    assert "| series | request_rate |" in (tmp_path / "summary.md").read_text()
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["cache_key"] for p in sweep["points"]] == list(table["cache_key"])


def test_process_pool_gives_the_same_records(tmp_path: Path) -> None:
    spec = _spec()
    tasks = [make_task(p.config, spec.report) for p in expand_points(spec)]
    inline, _ = run_tasks(tasks, InlineBackend(), ResultCache(None))
    pool = PoolBackend(2)
    try:
        pooled, stats = run_tasks(tasks, pool, ResultCache(tmp_path))
    finally:
        pool.close()
    assert stats.num_run == 4 and stats.workers == 2
    assert [_without_wall(normalized(r)) for r in inline] == [_without_wall(r) for r in pooled]


def _cli(argv: list[str]) -> int:
    from experiments.cli import main

    return main(argv)


def test_cli_runs_and_rejects_unknown_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    f = tmp_path / "exp.toml"
    f.write_text(EXPERIMENT)
    assert _cli(["sweep", str(f), "--out", str(tmp_path / "o"), "-j", "1", "--no-plots"]) == 0
    out = capsys.readouterr()
    assert "| max_num_seqs=4 | 5 |" in out.out and "4 run, 0 cached" in out.err
    assert _cli(["sweep", str(f), "--out", str(tmp_path / "o"), "-j", "1", "--no-plots"]) == 0
    assert "0 run, 4 cached" in capsys.readouterr().err
    f.write_text(EXPERIMENT.replace("max_num_seqs = ", "max_num_seqz = "))
    assert _cli(["sweep", str(f), "--dry-run"]) == 2
    msg = capsys.readouterr().err
    assert msg.startswith("twinserve: error: ") and msg.count("\n") <= 4
    assert "unknown key 'max_num_seqz'" in msg and "engine.max_num_seqs" in msg
    assert "workload.request_rate" in msg  # the whole valid list
