"""``TorchExecutor``: the real world's implementation of the core's ``Executor`` protocol.

The protocol (engine/core/interfaces.py; see engine/worker/README.md for the full contract)::

    class Executor(Protocol):
        def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput: ...

Contract: the driver passes *every* ``SchedulerOutput`` that ``EngineCore.begin_step`` returns,
exactly once and in ``step_id`` order (also empty ones: they carry finished ids); the executor
returns the tokens sampled for each request that completed its prefill, plus the measured step
time. Execution is synchronous and in-process, so under async scheduling the driver may call
``execute_model`` at submit time and apply results FIFO with ``finish_step`` later: the worker
appends its own samples, so step N+1 always sees step N's tokens.

Responsibility of this class: build everything a step needs once — device, dtype, model
(checkpoint or dummy weights), attention backend, KV cache sized from memory (see
``engine.worker.kv_cache`` for the rules) — and then run steps, timing each one (CUDA
synchronised) and keeping ``StepTiming`` rows ``(step_id, batch_shape, execute_time_s)`` for
profiles and sim-vs-real comparisons. ``num_gpu_blocks`` is known after construction; the driver
builds the core's ``CacheConfig`` from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.core.config import SchedulerConfig
from engine.core.outputs import BatchShape, ModelRunnerOutput, SchedulerOutput
from engine.worker.config import WorkerConfig
from engine.worker.distributed import SINGLE_RANK, ParallelContext
from engine.worker.errors import KVCacheSizeError
from engine.worker.kv_cache import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    KVCacheSpec,
    allocate_kv_caches,
    check_num_blocks,
    cuda_kv_cache_bytes,
    format_bytes,
    num_blocks_for_bytes,
)
from engine.worker.loader import load_model, resolve_device
from engine.worker.model_runner import ModelRunner
from engine.worker.sampler import Sampler


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One executed step: what it computed and how long it took on this device."""

    step_id: int  # SchedulerOutput.step_id
    batch_shape: BatchShape  # the step's shape (what a cost model sees)
    execute_time_s: float  # wall time of execute_model (device synchronised)


class TorchExecutor:
    """One process, one device: model + KV cache + sampler behind ``execute_model``.

    Given a ``ParallelContext`` it is one rank of a parallel replica (what each worker process
    of the multiprocess executor runs): its model is the rank's shard, its KV cache holds the
    rank's layers and KV heads, and its block count is the smallest any rank of the replica
    can hold (all ranks agree on it, so the scheduler sees one cache)."""

    def __init__(
        self,
        config: WorkerConfig,
        scheduler_config: SchedulerConfig,
        block_size: int,
        ctx: ParallelContext = SINGLE_RANK,
        device: torch.device | None = None,
    ) -> None:
        self.config = config
        self.scheduler_config = scheduler_config
        self.block_size = block_size
        self.ctx = ctx
        self.device = device if device is not None else resolve_device(config.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # Triton launches on the current device
        self.model = load_model(
            config.model,
            dtype=config.dtype,
            device=self.device,
            attention_backend=config.attention_backend,
            load_format=config.load_format,
            seed=config.seed,
            dummy_weight_std=config.dummy_weight_std,
            ctx=ctx,
        )
        self.model_config = self.model.config
        self.dtype = self.model.dtype
        self.kv_spec = KVCacheSpec.for_shard(
            len(self.model.layers), self.model.plan.num_kv_heads, self.model_config.head_dim,
            block_size, self.dtype,
        )
        self.runner = ModelRunner(self.model, [], block_size, Sampler(self.device, config.seed))
        self.num_gpu_blocks = ctx.min_over_ranks(self._determine_num_blocks(), self.device)
        self.kv_cache_bytes = self.num_gpu_blocks * self.kv_spec.bytes_per_block
        try:
            self.runner.kv_caches = allocate_kv_caches(
                self.kv_spec, self.num_gpu_blocks, self.device
            )
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            raise KVCacheSizeError(
                f"cannot allocate a KV cache of {self.num_gpu_blocks} blocks "
                f"({format_bytes(self.kv_cache_bytes)}) on {self.device}: {exc}"
            ) from None
        self.step_timings: list[StepTiming] = []

    @property
    def attention_backend(self) -> str:
        return self.model.attention.backend.value

    # -- KV cache sizing ------------------------------------------------------------------------
    def _determine_num_blocks(self) -> int:
        cfg, spec = self.config, self.kv_spec
        max_model_len = self.scheduler_config.max_model_len
        kv_bytes: int | None = cfg.kv_cache_memory_bytes
        if self.device.type == "cuda":
            profiled = self._profile_cuda_kv_bytes()
            if kv_bytes is None and cfg.num_gpu_blocks_override is None:
                kv_bytes = profiled
        if cfg.num_gpu_blocks_override is not None:
            num_blocks, source = cfg.num_gpu_blocks_override, "num_gpu_blocks"
        else:
            if kv_bytes is None:
                kv_bytes = DEFAULT_CPU_KV_CACHE_BYTES
            num_blocks = num_blocks_for_bytes(spec, kv_bytes)
            source = f"{format_bytes(kv_bytes)} of KV memory"
        check_num_blocks(spec, num_blocks, max_model_len, source)
        return num_blocks

    def _profile_cuda_kv_bytes(self) -> int:
        """Rule 3 of ``engine.worker.kv_cache``: a profiling forward at the token budget."""
        device = self.device
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        dummy = allocate_kv_caches(self.kv_spec, 1, device)
        sched = self.scheduler_config
        self.runner.profile_run(sched.token_budget, sched.max_num_seqs, dummy)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        del dummy
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
        return cuda_kv_cache_bytes(
            total_bytes=total,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            torch_peak_bytes=peak,
            non_torch_bytes=non_torch,
        )

    # -- the Executor protocol ------------------------------------------------------------------
    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; returns sampled tokens and the measured step time."""
        start = time.perf_counter()
        sampled = self.runner.execute(sched_out)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.step_timings.append(StepTiming(sched_out.step_id, sched_out.batch_shape, elapsed))
        return ModelRunnerOutput(sampled, execute_time_s=elapsed)

    def shutdown(self) -> None:
        """Release the KV cache and the model (device memory returns to the allocator)."""
        self.runner.kv_caches = []
        self.runner.states.states.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
