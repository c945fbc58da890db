"""Run many simulated points, each once: a result cache keyed by the full config, a backend
(inline, process pool or Ray), progress on stderr.

A *task* is a plain dict ``{"config": full SimConfig dict, "report": summary options}`` (plus
``run_dir`` with ``--save-runs``, which does not change the result). Its cache key is the
SHA-256 of the canonical JSON of the config, the report options, the digests of any input
files it names (a trace file, a fitted cost model), the catalog entries it reads (GPU
efficiencies, model shape), twinserve's version and ``CACHE_VERSION``;
the record lies in ``CACHE_DIR/<key>.json``. With ``resume`` (the default) a cached point is
never run again, so rerunning a sweep with one added point runs only that point.

Invariants: a record is written to the cache only after its run completed without error, in
one atomic rename; records that come back from the cache equal the ones computed (both went
through JSON).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from experiments.sweep.backends import Backend

#: Bump when records computed by older code must not be reused.
CACHE_VERSION = 1


def make_task(
    config: Mapping[str, Any], report: Mapping[str, Any], run_dir: str | None = None
) -> dict[str, Any]:
    task: dict[str, Any] = {"config": dict(config), "report": dict(report)}
    if run_dir is not None:
        task["run_dir"] = run_dir
    return task


def canonical_json(value: Any) -> str:
    from reports.meta import to_jsonable

    return json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)


@cache
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def input_digests(config: Mapping[str, Any]) -> dict[str, str]:
    """SHA-256 of user files the config names (built-in traces are part of the code)."""
    from workload.traces import TRACES

    paths = {}
    dataset = (config.get("workload") or {}).get("dataset_path")
    if dataset and dataset not in TRACES:
        paths["dataset_path"] = dataset
    cost_model = str(config.get("cost_model", ""))
    if cost_model.startswith("fitted:"):
        paths["cost_model"] = cost_model.split(":", 1)[1]
    out = {}
    for name, path in paths.items():
        if os.path.isfile(path):
            st = os.stat(path)
            out[name] = _file_digest(os.path.abspath(path), st.st_mtime_ns, st.st_size)
    return out


def _version() -> str | None:
    try:
        return metadata.version("twinserve")
    except metadata.PackageNotFoundError:
        return None


def catalog_facts(config: Mapping[str, Any]) -> dict[str, Any]:
    """The catalog entries a run reads (GPU efficiencies, model shape): recalibrating the
    roofline or editing the catalog changes the key, so stale results are never reused."""
    import dataclasses

    from sim.hardware import get_gpu
    from sim.model_catalog import get_model

    facts: dict[str, Any] = {}
    try:
        facts["gpu"] = dataclasses.asdict(get_gpu(str(config.get("gpu", "h100-sxm"))))
        facts["model"] = dataclasses.asdict(
            get_model(str(config.get("model", "meta-llama/Llama-3.1-8B")))
        )
    except ValueError:
        pass  # an invalid name fails validation before any run
    return facts


def cache_key(task: Mapping[str, Any]) -> str:
    """SHA-256 hex of everything the task's record depends on (see the module docstring)."""
    payload = {
        "cache_version": CACHE_VERSION,
        "twinserve_version": _version(),
        "config": task["config"],
        "report": task["report"],
        "inputs": input_digests(task["config"]),
        "catalog": catalog_facts(task["config"]),
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


class ResultCache:
    """Records on disk, one JSON file per cache key (``None`` directory = no cache)."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = Path(directory) if directory is not None else None

    def get(self, key: str) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        path = self.directory / f"{key}.json"
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if entry.get("cache_version") != CACHE_VERSION or entry.get("key") != key:
            return None
        return _decoded(entry["record"])

    def put(self, key: str, task: Mapping[str, Any], record: Mapping[str, Any]) -> None:
        if self.directory is None:
            return
        from reports.meta import to_jsonable

        self.directory.mkdir(parents=True, exist_ok=True)
        entry = {"cache_version": CACHE_VERSION, "key": key,
                 "task": {k: v for k, v in task.items() if k != "run_dir"},
                 "record": to_jsonable(record)}
        tmp = self.directory / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(entry, allow_nan=False) + "\n")
        os.replace(tmp, self.directory / f"{key}.json")


def _decoded(record: Mapping[str, Any]) -> dict[str, Any]:
    """JSON's None/"inf" back to floats where a number belongs (as ``to_jsonable`` wrote)."""
    out = {}
    for k, v in record.items():
        if v == "inf":
            v = float("inf")
        elif v == "-inf":
            v = float("-inf")
        out[k] = v
    return out


def normalized(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as it comes back from the cache (for comparing fresh and cached records)."""
    from reports.meta import to_jsonable

    return _decoded(json.loads(json.dumps(to_jsonable(record))))


@dataclass(slots=True)
class RunStats:
    """What one ``run_tasks`` call did."""

    num_tasks: int = 0
    num_cached: int = 0
    num_run: int = 0
    num_failed: int = 0
    run_wall_s: float = 0.0  # wall time spent running the tasks that were not cached
    workers: int = 1
    ran_keys: list[str] = field(default_factory=list)

    @property
    def sims_per_minute(self) -> float:
        return 60.0 * self.num_run / self.run_wall_s if self.run_wall_s > 0 else float("nan")


def run_tasks(
    tasks: Sequence[Mapping[str, Any]],
    backend: Backend,
    cache: ResultCache,
    *,
    resume: bool = True,
    progress: Callable[[int, int, RunStats], None] | None = None,
) -> tuple[list[dict[str, Any]], RunStats]:
    """Records of ``tasks`` in order: from the cache (``resume``) or run on ``backend``.

    Tasks with the same key run once. A task whose run raised or returned an ``error`` gets
    a record ``{"error": ...}`` and is not cached.
    """
    keys = [cache_key(t) for t in tasks]
    stats = RunStats(num_tasks=len(tasks), workers=backend.workers)
    by_key: dict[str, dict[str, Any]] = {}
    pending: dict[str, Mapping[str, Any]] = {}
    for key, task in zip(keys, tasks, strict=True):
        if key in by_key or key in pending:
            continue
        hit = cache.get(key) if resume else None
        if hit is not None:
            by_key[key] = hit
        else:
            pending[key] = task
    stats.num_cached = len(by_key)
    done = len(by_key)
    total = len(by_key) + len(pending)
    if progress is not None:
        progress(done, total, stats)
    t0 = time.perf_counter()
    futures: dict[Future[dict[str, Any]], str] = {
        backend.submit(task): key for key, task in pending.items()
    }
    for future in as_completed(futures):
        key = futures[future]
        try:
            record = future.result()
        except Exception as exc:  # a bug in a worker: keep the other points
            record = {"error": f"{type(exc).__name__}: {exc}"}
        if record.get("error"):
            stats.num_failed += 1
        else:
            record = normalized(record)
            cache.put(key, pending[key], record)
            stats.ran_keys.append(key)
        by_key[key] = record
        stats.num_run += 1
        stats.run_wall_s = time.perf_counter() - t0
        done += 1
        if progress is not None:
            progress(done, total, stats)
    return [dict(by_key[k], cache_key=k) for k in keys], stats


class ProgressLine:
    """``sweep: 12/40 points (8 cached) … 23.1 sims/min, ETA 1m05s`` on stderr; refreshed in
    place on a terminal, every ~10% otherwise."""

    def __init__(self, label: str = "sweep", stream: Any = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_decile = -1

    def __call__(self, done: int, total: int, stats: RunStats) -> None:
        rate = stats.sims_per_minute
        remaining = total - done
        eta = ""
        if stats.num_run and remaining and rate == rate:
            s = int(remaining / rate * 60)
            eta = f", ETA {s // 60}m{s % 60:02d}s"
        speed = f", {rate:.1f} sims/min" if stats.num_run else ""
        failed = f", {stats.num_failed} failed" if stats.num_failed else ""
        line = (f"{self.label}: {done}/{total} points ({stats.num_cached} cached{failed}) on "
                f"{stats.workers} worker(s){speed}{eta}")
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if done == total else ""))
        else:
            decile = 10 * done // max(total, 1)
            if decile == self._last_decile and done != total:
                return
            self._last_decile = decile
            self.stream.write(line + "\n")
        self.stream.flush()
