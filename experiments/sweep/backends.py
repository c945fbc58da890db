"""Where sweep tasks run: in this process, in a local process pool, or on a Ray cluster.

A backend has one job — ``submit(task) -> Future`` of ``run_task(task)`` — so the sweep driver
and the capacity search treat all three alike (``concurrent.futures.as_completed`` /
``Future.result``); ``submit_call(fn, *args)`` runs any module-level function the same way
(the shards of a data-parallel run, ``sim/fleet.py``). No home-made distribution: the pool is
``ProcessPoolExecutor``; Ray tasks are ``ray.remote`` functions whose ``ObjectRef.future()`` is
a ``concurrent.futures.Future``.

Tasks are plain picklable dicts (``sweep.make_task``); ``run_task`` is a module-level function,
so pool and Ray workers import it by name (Ray cluster nodes need twinserve installed).

Stopping (the one policy sweep, plan and validate share): ``close(cancel=True)`` — what every
backend's user calls when it is interrupted or fails — drops the tasks not started and stops
the ones running at once (pool workers are terminated, Ray tasks cancelled), instead of
waiting for them. Pool workers are forked from the main thread when the backend is created,
ignore SIGINT (a Ctrl-C to the terminal's process group reaches the command, which decides)
and die with the command even when it is killed (``engine.process_guard``), so no worker
outlives the command, idle or busy.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from engine.core.errors import UserError

BACKENDS: tuple[str, ...] = ("process", "ray")

T = TypeVar("T")


def run_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """Run one sweep task (``{"config", "report", "run_dir"?}``) → its record.

    Bad input inside the run (a ``UserError``) becomes a record with an ``error`` field rather
    than an exception, so one bad point does not lose the others.
    """
    from experiments.sweep.records import simulate_record

    try:
        return simulate_record(task["config"], task["report"], run_dir=task.get("run_dir"))
    except UserError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


class Backend(Protocol):
    """Runs tasks somewhere; ``workers`` is how many may run at once."""

    workers: int

    def submit(self, task: Mapping[str, Any]) -> Future[dict[str, Any]]: ...

    def submit_call(self, fn: Callable[..., T], *args: Any) -> Future[T]: ...

    def close(self, cancel: bool = False) -> None:
        """Release the workers: after the tasks submitted, or at once with ``cancel``."""
        ...


@contextlib.contextmanager
def running(backend: Backend) -> Iterator[Backend]:
    """``backend`` for a ``with`` block: closed normally when the block ends, cancelled when
    it raises (an error, or an interruption) so nothing waits for tasks no one will read."""
    try:
        yield backend
    except BaseException:
        backend.close(cancel=True)
        raise
    backend.close()


class InlineBackend:
    """Runs each task at submission, in this process (``--jobs 1``; tests; custom cost models).

    ``fn`` replaces ``run_task`` (it need not be picklable here)."""

    workers = 1

    def __init__(self, fn: Callable[[Mapping[str, Any]], dict[str, Any]] = run_task) -> None:
        self._fn = fn

    def submit(self, task: Mapping[str, Any]) -> Future[dict[str, Any]]:
        return self.submit_call(self._fn, task)

    def submit_call(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # delivered through the future, as a pool would
            future.set_exception(exc)
        return future

    def close(self, cancel: bool = False) -> None:
        pass


def _init_worker(parent_pid: int) -> None:
    """A pool worker: SIGINT is the parent's to handle, SIGTERM ends the worker, and the
    worker dies with the parent (see the module docstring)."""
    from engine.process_guard import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(parent_pid=parent_pid)


def _ready() -> bool:
    return True


#: Seconds terminated workers get to exit before they are killed.
STOP_TIMEOUT_S = 2.0


class PoolBackend:
    """A local ``ProcessPoolExecutor`` of ``jobs`` processes."""

    def __init__(self, jobs: int) -> None:
        if jobs < 1:
            raise UserError(f"--jobs must be >= 1, got {jobs}")
        self.workers = jobs
        # fork starts workers with the simulator already imported; spawn elsewhere
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context(method),
            initializer=_init_worker, initargs=(os.getpid(),),
        )
        # start the workers now, from this (main) thread: a worker dies with the thread that
        # forked it, and the capacity search submits from its own threads
        self._pool.submit(_ready).result()

    def submit(self, task: Mapping[str, Any]) -> Future[dict[str, Any]]:
        return self._pool.submit(run_task, dict(task))

    def submit_call(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self._pool.submit(fn, *args)

    def close(self, cancel: bool = False) -> None:
        if not cancel:
            self._pool.shutdown(wait=True)
            return
        processes = list(getattr(self._pool, "_processes", {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            with contextlib.suppress(OSError, ValueError):
                p.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    p.kill()
                p.join(1.0)


class RayBackend:
    """Tasks as Ray remote functions: a local Ray started here, or ``address`` joined.

    A Ray this backend started is shut down by ``close``; one already initialised in the
    process (or a joined cluster) is left running."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            ray = None
        if ray is None or not hasattr(ray, "is_initialized"):  # a bare directory named ray
            raise UserError(
                "--backend ray needs Ray: pip install 'twinserve[ray]' (ray==2.60.0)"
            ) from None
        self._ray = ray
        self._owned = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                kwargs["address"] = address
            elif num_cpus:
                kwargs["num_cpus"] = num_cpus
            ray.init(**kwargs)
            self._owned = address is None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remotes: dict[Callable[..., Any], Any] = {}
        self._refs: list[Any] = []

    def submit(self, task: Mapping[str, Any]) -> Future[dict[str, Any]]:
        return self.submit_call(run_task, dict(task))

    def submit_call(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = self._ray.remote(num_cpus=1)(fn)
        ref = remote.remote(*args)
        self._refs.append(ref)
        future: Future[T] = ref.future()
        return future

    def close(self, cancel: bool = False) -> None:
        if cancel:
            for ref in self._refs:
                with contextlib.suppress(Exception):  # done already, or Ray is going down
                    self._ray.cancel(ref, force=True)
        self._refs.clear()
        if self._owned:
            self._ray.shutdown()


#: Most parallel workers a sweep or plan may ask for (each is a process or a Ray task slot).
MAX_JOBS = 1024


def check_jobs(jobs: int | None) -> None:
    """Refuse a worker count no machine could start (checked before any work)."""
    if jobs is not None and jobs > MAX_JOBS:
        raise UserError(f"--jobs must be <= {MAX_JOBS}, got {jobs}")


def worker_count(name: str, jobs: int | None) -> int:
    """How many simulations ``make_backend(name, jobs)`` runs at once on this machine."""
    if name == "process":
        return jobs if jobs is not None else (os.cpu_count() or 1)
    return jobs if jobs is not None else 1


def make_backend(name: str, jobs: int | None, ray_address: str | None = None) -> Backend:
    """``process`` with ``jobs`` workers (1 = inline, None = all CPUs) or ``ray``."""
    check_jobs(jobs)
    if name == "process":
        n = worker_count(name, jobs)
        return InlineBackend() if n == 1 else PoolBackend(n)
    if name == "ray":
        return RayBackend(ray_address, num_cpus=jobs)
    raise UserError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
