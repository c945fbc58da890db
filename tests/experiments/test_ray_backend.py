"""The Ray backend gives the same records as the local process pool (starts a local Ray, so it
is marked ``ray`` and left out of the default run; skipped when Ray is not installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.sweep.backends import PoolBackend, RayBackend
from experiments.sweep.expfile import expand_points
from experiments.sweep.runner import ResultCache, make_task, run_tasks
from tests.experiments.test_sweep import _spec, _without_wall

pytestmark = pytest.mark.ray


def test_ray_matches_the_process_pool(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    spec = _spec()
    tasks = [make_task(p.config, spec.report) for p in expand_points(spec)]
    pool = PoolBackend(2)
    try:
        pooled, _ = run_tasks(tasks, pool, ResultCache(tmp_path / "pool"))
    finally:
        pool.close()
    ray_backend = RayBackend(num_cpus=2)
    try:
        rayed, stats = run_tasks(tasks, ray_backend, ResultCache(tmp_path / "ray"))
    finally:
        ray_backend.close()
    assert stats.num_run == len(tasks) and stats.num_failed == 0
    assert [_without_wall(r) for r in rayed] == [_without_wall(r) for r in pooled]
