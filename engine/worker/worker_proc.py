"""A worker process of the multiprocess executor: one rank of a parallel model replica.

Responsibility: join the replica's torch.distributed group, build this rank's shard of the
model and its KV cache (a ``TorchExecutor`` with this rank's ``ParallelContext``; every rank
agrees on the block count), report ready, then run every scheduler output the EngineCore sends,
in order, until told to stop. Only the output rank (TP rank 0 of the last pipeline stage)
returns the sampled tokens; every rank reports a failure.

Messages (pickled, over ZeroMQ): in, ``Execute`` or ``Shutdown`` on this rank's PULL socket;
out, ``WorkerReady``, ``StepResult`` or ``WorkerFailed`` on the executor's PULL socket. A
worker whose parent (the EngineCore process) is gone exits at once: it never outlives it.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import torch
import zmq

from engine.core.config import SchedulerConfig
from engine.core.errors import UserError
from engine.core.outputs import SchedulerOutput
from engine.core.process_name import set_process_name
from engine.worker.config import WorkerConfig
from engine.worker.distributed import RankPlace, destroy_distributed, init_distributed


@dataclass(frozen=True, slots=True)
class WorkerProcConfig:
    """Everything one worker process needs (picklable: it crosses the spawn)."""

    place: RankPlace
    worker: WorkerConfig
    scheduler: SchedulerConfig
    block_size: int
    device: str  # "cpu" or "cuda:N"
    init_method: str  # torch.distributed rendezvous (a file:// store of the executor)
    input_address: str  # this rank's PULL (the executor PUSHes each step here)
    output_address: str  # the executor's PULL (ready, results, failures)
    process_name: str  # vLLM's name: Worker_TPt or Worker_PPp_TPt
    cpu_threads: int  # torch CPU threads (0: torch's default)
    parent_pid: int  # the EngineCore process; the worker exits when it is gone


@dataclass(frozen=True, slots=True)
class Execute:
    sched_out: SchedulerOutput


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class WorkerReady:
    rank: int
    num_gpu_blocks: int  # agreed by every rank of the replica
    kv_cache_bytes: int  # this rank's cache
    attention_backend: str


@dataclass(frozen=True, slots=True)
class StepResult:
    step_id: int
    sampled_token_ids: dict[str, list[int]]
    execute_time_s: float  # the output rank's wall time of the step (device synchronised)


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    rank: int
    message: str
    is_user_error: bool  # bad input (one line for the user) rather than a bug


def run_worker(cfg: WorkerProcConfig) -> None:
    """Entry point of a worker process."""
    set_process_name(cfg.process_name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the EngineCore orders the shutdown
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a forked worker inherits its handler)
    _watch_parent(cfg.parent_pid)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 5000)
    out.connect(cfg.output_address)
    inp = ctx.socket(zmq.PULL)
    inp.setsockopt(zmq.LINGER, 0)
    inp.connect(cfg.input_address)
    rank = cfg.place.rank
    try:
        executor = _build(cfg)
        out.send(pickle.dumps(WorkerReady(rank, executor.num_gpu_blocks,
                                          executor.kv_cache_bytes, executor.attention_backend)))
        _serve(executor, inp, out, cfg.place.is_output_rank)
    except UserError as exc:
        out.send(pickle.dumps(WorkerFailed(rank, str(exc), True)))
    except Exception:
        out.send(pickle.dumps(WorkerFailed(rank, traceback.format_exc(), False)))
    finally:
        inp.close()
        out.close()
        ctx.term()
        destroy_distributed()


def _build(cfg: WorkerProcConfig) -> object:
    from engine.worker.executor import TorchExecutor
    from engine.worker.loader import resolve_device

    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    pctx = init_distributed(cfg.place, cfg.init_method, device)
    return TorchExecutor(cfg.worker, cfg.scheduler, cfg.block_size, pctx, device)


def _serve(executor: object, inp: zmq.Socket[bytes], out: zmq.Socket[bytes],
           is_output_rank: bool) -> None:
    from engine.worker.executor import TorchExecutor

    assert isinstance(executor, TorchExecutor)
    while True:
        message = pickle.loads(inp.recv())
        if isinstance(message, Shutdown):
            executor.shutdown()
            return
        assert isinstance(message, Execute)
        result = executor.execute_model(message.sched_out)
        if is_output_rank:
            out.send(pickle.dumps(StepResult(
                message.sched_out.step_id, result.sampled_token_ids,
                result.execute_time_s or 0.0,
            )))


#: How often a worker checks that its EngineCore is still there.
PARENT_POLL_S = 0.2


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the EngineCore process is gone (this process was re-parented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
