"""``engine.worker.profiler`` on the tiny model: the grid, hand-made schedules that reproduce the
asked-for shape, per-unit costs, and the CSV contract with ``sim.cost.fitted``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from engine.worker.profiler import (
    PROFILE_COLUMNS,
    ProfileGrid,
    SampleStats,
    ShapeSpec,
    StepProfiler,
    _shape_of,
    quick_grid,
    time_unit_costs,
    write_profile_csv,
)
from sim.cost.fitted import read_profile_csv


def test_shape_spec_batch_shape_matches_the_schedules_shape() -> None:
    spec = ShapeSpec("mixed", ((64, 16), (32, 0)), (10, 20, 30), num_partial=1)
    replay = {"d0": (10, 1), "d1": (20, 1), "d2": (30, 1), "p0": (16, 64), "p1": (0, 32)}
    assert spec.batch_shape() == _shape_of(replay, 1)
    s = spec.batch_shape()
    assert (s.num_reqs, s.num_tokens, s.num_decode_reqs, s.num_sampling_reqs) == (5, 99, 3, 4)
    assert (s.decode_context_sum, s.decode_context_max) == (60, 30)
    assert spec.num_blocks(16) == 1 + 2 + 2 + 6 + 3


@pytest.mark.parametrize("kwargs", [
    {"kind": "chunk", "prefill_chunks": (), "decode_context_lens": (1,)},
    {"kind": "prefill", "prefill_chunks": ((1, 0),), "decode_context_lens": ()},
    {"kind": "decode", "prefill_chunks": (), "decode_context_lens": ()},
    {"kind": "prefill", "prefill_chunks": ((4, 0),), "decode_context_lens": (), "num_partial": 2},
])
def test_shape_spec_rejects_impossible_steps(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ShapeSpec(**kwargs)  # type: ignore[arg-type]


def test_grid_keeps_to_the_engines_limits() -> None:
    grid = ProfileGrid(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=300)
    shapes = grid.shapes()
    assert shapes and len(set(shapes)) == len(shapes)
    assert all(s.num_tokens <= 256 and s.num_reqs <= 16 and s.max_seq_len() <= 300
               for s in shapes)
    assert {s.kind for s in shapes} == {"prefill", "decode", "mixed"}
    assert any(s.num_partial for s in shapes)
    assert grid.num_blocks(16) == 1 + max(s.num_blocks(16) for s in shapes)
    with pytest.raises(ValueError):
        ProfileGrid(repeats=0)


def test_sample_stats() -> None:
    st = SampleStats.of([1.0, 2.0, 3.0, 10.0], [1.0, 1.0, 3.0, 5.0])
    assert (st.median_s, st.mean_s, st.min_s, st.max_s, st.num_samples) == (2.5, 4.0, 1, 10, 4)
    assert st.cpu_ratio == pytest.approx(0.75)
    assert math.isnan(SampleStats.of([1.0]).cpu_ratio)
    with pytest.raises(ValueError):
        SampleStats.of([])


@pytest.fixture(scope="module")
def engine(tiny_model: Path):  # type: ignore[no-untyped-def]
    from engine.llm import EngineArgs

    return EngineArgs(model=str(tiny_model), device="cpu", num_gpu_blocks=80,
                      max_model_len=512).build()


def test_profiler_measures_each_shape_and_releases_the_worker(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    grid = quick_grid(256, 16, 512, prefill_query_lens=(32,), prefill_context_lens=(0, 40),
                      prefill_batch_sizes=(1,), partial_query_lens=(48,),
                      decode_batch_sizes=(3,), decode_context_lens=(20,),
                      mixed_decode_batch_sizes=(2,), mixed_query_lens=(16,), rounds=2, repeats=2)
    rows = StepProfiler(engine.executor).profile(grid)
    specs = grid.shapes()
    assert [r.shape for r in rows] == [s.batch_shape() for s in specs]
    assert all(r.stats.num_samples == 4 and r.stats.median_s > 0 for r in rows)
    assert all(r.name == "step" and r.size == r.shape.num_tokens for r in rows)  # type: ignore[union-attr]
    partial = [r for r in rows if r.shape.num_sampling_reqs < r.shape.num_reqs]  # type: ignore[union-attr]
    assert len(partial) == 1
    assert len(engine.executor.runner.states) == 0  # every profiling request was dropped
    assert engine.executor.step_timings == []
    path = write_profile_csv(tmp_path / "p.csv", rows)
    assert path.read_text().splitlines()[0].split(",") == list(PROFILE_COLUMNS)
    back = read_profile_csv(path)
    assert [b.shape for b in back] == [r.shape for r in rows]
    assert [b.median_s for b in back] == [r.stats.median_s for r in rows]


def test_wakeup_probe_times_the_step_after_each_idle_duration(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = ShapeSpec("prefill", ((32, 0),), ())
    rows = StepProfiler(engine.executor).measure_wakeup(spec, (0.001, 0.004), samples=3)
    assert [(r.kind, r.name, r.size, r.stats.num_samples) for r in rows] == [
        ("loop", "wakeup", 0, 6), ("loop", "wakeup", 1000, 3), ("loop", "wakeup", 4000, 3)]
    assert all(r.shape is None and r.stats.median_s > 0 for r in rows)
    assert len(engine.executor.runner.states) == 0 and engine.executor.step_timings == []
    back = read_profile_csv(write_profile_csv(tmp_path / "w.csv", rows))
    assert [(b.kind, b.name, b.size) for b in back] == [(r.kind, r.name, r.size) for r in rows]
    with pytest.raises(ValueError, match="idle"):
        StepProfiler(engine.executor).measure_wakeup(spec, (0.0,))


def test_profiler_refuses_a_kv_cache_too_small_for_the_grid(engine) -> None:  # type: ignore[no-untyped-def]
    grid = ProfileGrid(decode_batch_sizes=(64,), decode_context_lens=(500,), max_model_len=1024)
    with pytest.raises(ValueError, match="KV blocks"):
        StepProfiler(engine.executor).profile(grid)


def test_time_unit_costs_one_row_per_size() -> None:
    calls: list[int] = []
    rows = time_unit_costs("frontend", "noop", calls.append, [1, 5], repeats=3, warmup=1,
                           inner=2)
    assert [(r.kind, r.name, r.size, r.stats.num_samples) for r in rows] == [
        ("frontend", "noop", 1, 3), ("frontend", "noop", 5, 3)]
    assert calls == [1] * 8 + [5] * 8
