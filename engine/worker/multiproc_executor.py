"""``MultiprocExecutor``: one worker process per rank of a TP × PP replica (vLLM's
``MultiprocExecutor``), behind the engine loop's ``NonBlockingExecutor`` seam.

Responsibility: start the replica's workers (``engine.worker.worker_proc``), hand every
scheduler output to all of them, in order, and give the engine loop each step's sampled tokens
as the output rank returns them; stop them all at shutdown, and never leave one behind.

The broadcast is ZeroMQ over IPC sockets: the scheduler output is pickled once and the same
bytes are pushed to each rank's socket. vLLM uses a shared-memory ring for this (readers spin
on it) with ZeroMQ for remote readers; here ZeroMQ everywhere, because its receives block
without spinning — ranks that share a few CPU cores (CPU runs, the tests) get the cores for
the model instead of a spin loop — and the same sockets work across nodes. The cost of the
hop (pickle + one IPC message per rank + the result back) is measured by
``bench/multiproc_executor.py`` against the in-process executor.

With pipeline stages the engine keeps one batch per stage in flight: ``submit`` returns at
once, so stage 0 starts batch N+1 while stage 1 runs batch N; results come back in step order
(every rank runs the steps in the order it received them).

Workers are forked, as vLLM's are (a fork shares the loaded torch; spawning each would import
it again), unless forking is unsafe here — CUDA initialised, or torch running multi-threaded
on the CPU (``start_method``) — and they are spawned; ``TWINSERVE_WORKER_MULTIPROC_METHOD``
(fork or spawn) overrides the choice.

Failures: a worker that reports an error, or dies, stops the replica — every worker is killed
and the error is raised in the EngineCore (``UserError`` for bad input such as a checkpoint that
cannot be sharded, so the CLI prints one line). Each worker watches this process and exits when
it is gone, so no worker outlives its EngineCore.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import zmq

from engine.core.config import SchedulerConfig
from engine.core.errors import UserError
from engine.core.outputs import ModelRunnerOutput, SchedulerOutput
from engine.core.parallel import ParallelConfig, worker_process_name
from engine.worker.config import WorkerConfig
from engine.worker.distributed import RankPlace
from engine.worker.executor import StepTiming
from engine.worker.loader import resolve_dtype
from engine.worker.model_config import load_model_config
from engine.worker.worker_proc import (
    Execute,
    Shutdown,
    StepResult,
    WorkerFailed,
    WorkerProcConfig,
    WorkerReady,
    run_worker,
)

#: Seconds workers get to load and agree on a KV cache size before the start is abandoned.
STARTUP_TIMEOUT_S = 600.0
#: Seconds workers get to exit after ``Shutdown`` before they are killed.
SHUTDOWN_TIMEOUT_S = 10.0


class WorkerError(RuntimeError):
    """A worker process failed or died; the replica cannot go on."""


class WorkerUserError(UserError):
    """A worker refused its input (e.g. a checkpoint it cannot shard): one line for the user."""


@dataclass(frozen=True, slots=True)
class _Worker:
    name: str
    process: BaseProcess


def start_method() -> str:
    """Fork when it is safe, else spawn (``TWINSERVE_WORKER_MULTIPROC_METHOD`` overrides).

    vLLM forks unless CUDA is initialised in this process. On CPU there is a second hazard:
    a process whose torch already ran multi-threaded kernels has an OpenMP thread team that a
    forked child inherits half-made (its first parallel kernel waits forever), so this
    process must also run torch single-threaded (the server's EngineCore does)."""
    chosen = os.environ.get("TWINSERVE_WORKER_MULTIPROC_METHOD")
    if chosen in ("fork", "spawn"):
        return chosen
    import torch

    if (torch.cuda.is_initialized() or "fork" not in mp.get_all_start_methods()
            or torch.get_num_threads() > 1):
        return "spawn"
    return "fork"


class _Pending:
    """A submitted step (``engine.serve.engine_loop.PendingBatch``)."""

    def __init__(self, executor: MultiprocExecutor, step_id: int, submit_s: float) -> None:
        self._executor = executor
        self._step_id = step_id
        self._submit_s = submit_s

    def wait(self) -> tuple[ModelRunnerOutput, float, float]:
        result = self._executor.result(self._step_id)
        end = self._executor.clock()
        return (ModelRunnerOutput(result.sampled_token_ids, result.execute_time_s),
                self._submit_s, end)


class MultiprocExecutor:
    """The workers of one TP × PP replica; ``submit`` / ``execute_model`` run a step on all."""

    def __init__(
        self,
        config: WorkerConfig,
        scheduler_config: SchedulerConfig,
        block_size: int,
        parallel: ParallelConfig,
        *,
        device_type: str = "cpu",
        first_device: int = 0,
        cpu_threads: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.parallel = parallel
        self.block_size = block_size
        self.clock = clock
        self.model_config = load_model_config(config.model)
        mc = self.model_config
        parallel.check_model(mc.num_attention_heads, mc.num_key_value_heads,
                             mc.num_hidden_layers, config.model)
        self.dtype = resolve_dtype(config.dtype, mc)
        self.device = device_type if device_type == "cpu" else f"{device_type}:{first_device}"
        self.step_timings: list[StepTiming] = []
        self._shapes: dict[int, object] = {}
        self._results: dict[int, StepResult] = {}
        self._tmp = Path(tempfile.mkdtemp(prefix="twinserve-workers-"))
        self._zmq = zmq.Context()
        self._inputs: list[zmq.Socket[bytes]] = []
        self._workers: list[_Worker] = []
        self._output = self._zmq.socket(zmq.PULL)
        self._output.setsockopt(zmq.LINGER, 0)
        self._output.bind(f"ipc://{self._tmp}/out")
        try:
            self._start(scheduler_config, block_size, device_type, first_device, cpu_threads)
            ready = self._await_ready()
        except BaseException:
            self.shutdown()
            raise
        self.num_gpu_blocks = ready[0].num_gpu_blocks
        self.kv_cache_bytes = sum(r.kv_cache_bytes for r in ready)
        self.attention_backend = ready[0].attention_backend

    # -- start-up -------------------------------------------------------------------------------
    def _start(self, scheduler: SchedulerConfig, block_size: int, device_type: str,
               first_device: int, cpu_threads: int) -> None:
        method = start_method()
        context = mp.get_context(method)
        if method == "fork":
            _warm_up_module_construction()
        parallel = self.parallel
        init_method = f"file://{self._tmp}/rendezvous"
        for rank in range(parallel.world_size):
            place = RankPlace(parallel, rank)
            address = f"ipc://{self._tmp}/in-{rank}"
            sock = self._zmq.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(address)
            self._inputs.append(sock)
            device = "cpu" if device_type == "cpu" else f"{device_type}:{first_device + rank}"
            name = worker_process_name(parallel, place.pp_rank, place.tp_rank)
            cfg = WorkerProcConfig(
                place=place, worker=self.config, scheduler=scheduler, block_size=block_size,
                device=device, init_method=init_method, input_address=address,
                output_address=f"ipc://{self._tmp}/out", process_name=name,
                cpu_threads=cpu_threads if device_type == "cpu" else 0,
                parent_pid=os.getpid(),
            )
            process = context.Process(target=run_worker, args=(cfg,), name=name)
            process.start()
            self._workers.append(_Worker(name, process))

    def _await_ready(self) -> list[WorkerReady]:
        ready: dict[int, WorkerReady] = {}
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < len(self._workers):
            message = self._receive(deadline)
            if isinstance(message, WorkerReady):
                ready[message.rank] = message
        return [ready[r] for r in sorted(ready)]

    # -- steps ----------------------------------------------------------------------------------
    def submit(self, sched_out: SchedulerOutput) -> _Pending:
        """Send the step to every rank; returns at once."""
        data = pickle.dumps(Execute(sched_out), protocol=pickle.HIGHEST_PROTOCOL)
        for sock in self._inputs:
            sock.send(data, copy=False)
        self._shapes[sched_out.step_id] = sched_out.batch_shape
        return _Pending(self, sched_out.step_id, self.clock())

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        """The ``Executor`` protocol: run one step and wait for it."""
        output, _, _ = self.submit(sched_out).wait()
        return output

    def result(self, step_id: int) -> StepResult:
        """The output rank's result of ``step_id`` (results arrive in step order)."""
        while step_id not in self._results:
            message = self._receive(None)
            if isinstance(message, StepResult):
                self._results[message.step_id] = message
        result = self._results.pop(step_id)
        shape = self._shapes.pop(step_id)
        self.step_timings.append(StepTiming(step_id, shape, result.execute_time_s))  # type: ignore[arg-type]
        return result

    def _receive(self, deadline: float | None) -> object:
        """The next message from any worker; raises if one failed or died."""
        while True:
            if self._output.poll(100):
                message = pickle.loads(self._output.recv())
                if isinstance(message, WorkerFailed):
                    self._fail(message)
                return message
            for worker in self._workers:
                if not worker.process.is_alive():
                    code = worker.process.exitcode
                    self.shutdown(timeout_s=1.0)
                    raise WorkerError(f"worker {worker.name} (pid {worker.process.pid}) died "
                                      f"with exit code {code}")
            if deadline is not None and time.monotonic() > deadline:
                self.shutdown()
                raise WorkerError(f"the workers did not start within {STARTUP_TIMEOUT_S:.0f} s")

    def _fail(self, failure: WorkerFailed) -> None:
        name = self._workers[failure.rank].name
        self.shutdown(timeout_s=1.0)  # the others may wait in a collective for the failed one
        if failure.is_user_error:
            raise WorkerUserError(failure.message)
        raise WorkerError(f"worker {name} failed:\n{failure.message}")

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop every worker (politely, then by force after ``timeout_s``) and release the
        sockets; idempotent."""
        if not self._workers and self._zmq.closed:
            return
        data = pickle.dumps(Shutdown())
        for sock in self._inputs:
            with contextlib.suppress(zmq.ZMQError):
                sock.send(data, zmq.NOBLOCK)
        deadline = time.monotonic() + timeout_s
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self._workers:
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5.0)
        self._workers = []
        for sock in [*self._inputs, self._output]:
            sock.close(linger=0)
        self._inputs = []
        self._zmq.term()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _warm_up_module_construction() -> None:
    """Build one module the way the model does (``skip_init``: on the meta device first), so
    torch's lazily imported meta kernels are loaded once here and every forked worker shares
    them instead of importing them again (seconds each on a busy machine)."""
    from torch import nn

    nn.utils.skip_init(nn.Linear, 1, 1)  # type: ignore[no-untyped-call]
