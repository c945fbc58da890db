"""An emulated device for the real server: the cost model's step time, waited out on a real clock.

``twinserve serve --emulate`` runs the same API servers, IPC and EngineCore process as a real
server; only the executor differs. ``EmulatedExecutor`` takes each scheduled batch at once
(``submit``), places it on the emulated device's timeline (it starts when the device is free
and lasts the cost model's step time) and, when the engine loop must apply it, sleeps until
that end. So under async scheduling step N+1 is scheduled while step N "runs", as on a GPU,
and the simulator's timing model meets real clients, real HTTP and real IPC.

Every request that completes its prefill samples the next token of a fixed cycle (the ids of a
fixed text in the served tokenizer), so streamed outputs read as words; no cycle token is an
EOS or stop token of the emulated model, so requests end at ``max_tokens`` or a stop string,
as the simulator's do.

Nothing here is imported by the simulator: the EngineCore process builds it through
``EmulatedEngineFactory`` (the layer that composes a server chooses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.core.config import EngineConfig
from engine.core.errors import UserError
from engine.core.hashing import TokenBlockHasher
from engine.core.interfaces import CostModel, StepTime
from engine.core.outputs import BatchShape, ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, SamplingParams
from sim.config import SimConfig, resolve_engine_config
from workload.admission import validate_prompt


@dataclass(frozen=True, slots=True)
class FixedCostModel:
    """Every step that computes anything takes ``step_s`` (0: no time at all) — to measure
    what the serving path itself adds to a device of known speed."""

    step_s: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.step_s <= 3600.0:
            raise UserError(f"a fixed step time must be in [0, 3600] s, got {self.step_s}")

    def step_time(self, shape: BatchShape) -> StepTime:
        return StepTime(total_s=self.step_s)


@dataclass(slots=True)
class _PendingStep:
    """A batch on the emulated device: done at ``end_s``."""

    output: ModelRunnerOutput
    start_s: float
    end_s: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def wait(self) -> tuple[ModelRunnerOutput, float, float]:
        delay = self.end_s - self.clock()
        if delay > 0:
            self.sleep(delay)
        return self.output, self.start_s, self.end_s


class EmulatedExecutor:
    """A non-blocking executor (``engine.serve.engine_loop.NonBlockingExecutor``) whose device
    is a timeline driven by a cost model."""

    def __init__(
        self,
        cost_model: CostModel,
        token_cycle: Sequence[int],
        clock: Callable[[], float],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not token_cycle:
            raise ValueError("the placeholder token cycle is empty")
        self.cost_model = cost_model
        self.token_cycle = tuple(token_cycle)
        self.clock = clock
        self.sleep = sleep
        self.device_free_s = 0.0  # when the device finishes the batches it was given
        self._position: dict[str, int] = {}  # output tokens each request has sampled

    def step_time(self, sched_out: SchedulerOutput) -> StepTime:
        if sched_out.total_num_scheduled_tokens == 0:
            return StepTime(total_s=0.0)
        return self.cost_model.step_time(sched_out.batch_shape)

    def submit(self, sched_out: SchedulerOutput) -> _PendingStep:
        for req_id in sched_out.finished_req_ids:
            self._position.pop(req_id, None)
        cost = self.step_time(sched_out).total_s
        start = max(self.clock(), self.device_free_s)
        self.device_free_s = start + cost
        cycle, position = self.token_cycle, self._position
        sampled: dict[str, list[int]] = {}
        partial = sched_out.partial_prefill_req_ids
        for req_id in sched_out.num_scheduled_tokens:
            if req_id in partial:
                continue
            k = position.get(req_id, 0)
            position[req_id] = k + 1
            sampled[req_id] = [cycle[k % len(cycle)]]
        output = ModelRunnerOutput(sampled, execute_time_s=cost)
        return _PendingStep(output, start, start + cost, self.clock, self.sleep)


@dataclass(slots=True)
class EmulatedEngine:
    """What the EngineCore process drives in emulation mode (``ServedEngine``)."""

    engine_config: EngineConfig
    executor: EmulatedExecutor
    vocab_size: int
    device: str
    block_hasher: TokenBlockHasher | None = field(default=None)

    def make_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
    ) -> Request:
        validate_prompt(prompt_token_ids, vocab_size=self.vocab_size,
                        max_model_len=self.engine_config.scheduler.max_model_len)
        return Request(
            req_id,
            sampling_params=params,
            prompt_token_ids=prompt_token_ids,
            arrival_time=arrival_time,
            priority=priority,
            block_hasher=self.block_hasher,
        )

    def shutdown(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class EmulatedEngineFactory:
    """Builds an ``EmulatedEngine`` for a simulated deployment (``EngineFactory``).

    The engine config is the simulator's own (``resolve_engine_config``: KV blocks from the
    GPU's memory, vLLM's per-GPU defaults), so a simulation of the same ``SimConfig`` runs the
    very same scheduler.
    """

    config: SimConfig
    token_cycle: tuple[int, ...]
    fixed_step_s: float | None = None  # every step takes this long (None: the config's model)

    def engine_config(self) -> EngineConfig:
        return resolve_engine_config(self.config)

    def cost_model(self) -> CostModel:
        if self.fixed_step_s is not None:
            return FixedCostModel(self.fixed_step_s)
        from sim.runtime import make_cost_model

        return make_cost_model(self.config)

    def build(self, clock: Callable[[], float], data_parallel_rank: int = 0) -> EmulatedEngine:
        """The emulated engine (every DP replica emulates the same device, so the rank does
        not matter)."""
        cfg = self.config
        engine_config = self.engine_config()
        cache = engine_config.cache
        hasher = TokenBlockHasher(cache.block_size) if cache.enable_prefix_caching else None
        device = f"emulated {cfg.gpu} x{cfg.tensor_parallel_size}"
        if self.fixed_step_s is not None:
            device += f" (every step {self.fixed_step_s * 1000:g} ms)"
        return EmulatedEngine(
            engine_config,
            EmulatedExecutor(self.cost_model(), self.token_cycle, clock),
            cfg.model_spec.vocab_size,
            device,
            hasher,
        )
