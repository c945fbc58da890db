"""The engines ``twinserve serve`` can put behind its EngineCore process.

The serving package (``engine.entrypoints``) knows engines only as an ``EngineFactory`` that
builds a ``ServedEngine`` inside the EngineCore process; this module composes the two kinds
from the worlds that own them, so neither world imports the other:

* ``RealEngineFactory`` — a checkpoint on the torch worker (``engine.llm.EngineArgs``), warmed
  up with one short request before the server accepts any;
* ``sim.emulation.EmulatedEngineFactory`` — the simulator's cost model on an emulated device
  (``--emulate``), built there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.core.config import EngineConfig
from engine.core.request import Request, SamplingParams

if TYPE_CHECKING:
    from engine.llm import EngineArgs, RealEngine, WorkerExecutor


class ServedRealEngine:
    """A ``RealEngine`` as the EngineCore process drives it (``ServedEngine``)."""

    def __init__(self, engine: RealEngine) -> None:
        self._engine = engine
        self.engine_config: EngineConfig = engine.engine_config
        self.executor: WorkerExecutor = engine.executor
        self.vocab_size = engine.model_config.vocab_size
        self.device = str(engine.executor.device)
        parallel = engine.args.parallel_config
        if parallel.world_size > 1:
            self.device += (f" (TP {parallel.tensor_parallel_size} × PP "
                            f"{parallel.pipeline_parallel_size} worker processes)")

    def make_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
    ) -> Request:
        return self._engine.make_request(req_id, prompt_token_ids, params, arrival_time,
                                         priority)

    def shutdown(self) -> None:
        self._engine.executor.shutdown()


@dataclass(frozen=True, slots=True)
class RealEngineFactory:
    """Loads a checkpoint in the EngineCore process (``EngineFactory``)."""

    args: EngineArgs
    cpu_threads: int = 0  # torch CPU threads (0 = torch's default)

    def build(self, clock: Callable[[], float], data_parallel_rank: int = 0) -> ServedRealEngine:
        if self.cpu_threads:
            import torch

            torch.set_num_threads(self.cpu_threads)
        from engine.serve.real_run import warm_up

        engine = self.args.build(data_parallel_rank=data_parallel_rank)
        warm_up(engine)
        return ServedRealEngine(engine)
