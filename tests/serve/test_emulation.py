"""Emulation mode: the simulator's cost model on a real clock, behind the real server.

The executor and the engine loop's non-blocking path are checked on a fake clock; then a real
emulated server is driven with a request stream and compared with ``twinserve simulate`` of
the same stream (TTFT and TPOT medians within 10% at light load).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import openai
import pandas as pd
import pytest

from bench.serve import replay
from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.hashing import TokenBlockHasher
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from engine.core.request import Request, SamplingParams
from engine.serve.engine_loop import EngineLoop, NonBlockingExecutor
from reports.tables import build_tables
from sim.config import SimConfig
from sim.emulation import EmulatedEngineFactory, EmulatedExecutor, FixedCostModel
from sim.runtime import run_simulation
from tests.serve.conftest import stop_and_check
from tests.serve.server import ServerProcess
from workload.build import build_workload
from workload.config import WorkloadConfig
from workload.prompts import synthetic_prompts


class FakeClock:
    """A clock that only sleeping advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class PerTokenCost:
    """1 ms per step plus 0.1 ms per scheduled token."""

    def step_time(self, shape: BatchShape) -> StepTime:
        return StepTime(total_s=1e-3 + 1e-4 * shape.num_tokens)


def _core(async_scheduling: bool) -> EngineCore:
    return EngineCore(EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
                                  async_scheduling=async_scheduling),
        cache=CacheConfig(num_gpu_blocks=64, block_size=16),
    ))


def _request(req_id: str, n: int, max_tokens: int) -> Request:
    return Request(req_id, sampling_params=SamplingParams(max_tokens=max_tokens),
                   prompt_token_ids=list(range(10, 10 + n)), block_hasher=TokenBlockHasher(16))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_emulated_device_timeline(async_scheduling: bool) -> None:
    """Steps run back to back on the device for exactly the cost model's time; under async
    scheduling step N+1 is scheduled before step N is waited for, so the device never idles
    while a request decodes; outputs cycle through the placeholder tokens per request."""
    clock = FakeClock()
    executor = EmulatedExecutor(PerTokenCost(), (101, 102, 103), clock, clock.sleep)
    assert isinstance(executor, NonBlockingExecutor)
    core = _core(async_scheduling)
    core.add_request(_request("a", 20, 5), 0.0)
    loop = EngineLoop(core, executor, clock)
    tokens: list[int] = []
    while loop.has_work():
        for out in loop.step():
            tokens.extend(out.new_token_ids)
    assert tokens == [101, 102, 103, 101, 102]
    steps = pd.DataFrame(core.event_log.steps_columns())
    ran = steps[steps["num_tokens"] > 0]
    cost = 1e-3 + 1e-4 * ran["num_tokens"].to_numpy()
    np.testing.assert_allclose(ran["execute_end_s"] - ran["execute_start_s"], cost)
    np.testing.assert_allclose(ran["execute_start_s"].to_numpy()[1:],
                               ran["execute_end_s"].to_numpy()[:-1])  # back to back
    np.testing.assert_allclose(ran["update_time_s"], ran["execute_end_s"])
    if async_scheduling:  # the next batch was scheduled before this one was applied
        assert (ran["schedule_time_s"].to_numpy()[1:] < ran["update_time_s"].to_numpy()[:-1]
                ).all()
    assert clock.now == pytest.approx(float(cost.sum()))


def test_emulated_executor_forgets_finished_requests() -> None:
    clock = FakeClock()
    executor = EmulatedExecutor(FixedCostModel(0.0), (7, 8), clock, clock.sleep)
    core = _core(False)
    loop = EngineLoop(core, executor, clock)
    for i in range(3):
        core.add_request(_request(str(i), 4, 3), 0.0)
    while loop.has_work():
        loop.step()
    assert executor._position == {}
    assert clock.slept == []  # zero-cost steps never sleep


def test_emulated_factory_uses_the_simulators_engine_config() -> None:
    cfg = SimConfig(model="meta-llama/Llama-3.1-70B", gpu="h100-sxm", tensor_parallel_size=4)
    factory = EmulatedEngineFactory(cfg, (5, 6))
    engine = factory.build(FakeClock())
    from sim.config import resolve_engine_config

    assert engine.engine_config == resolve_engine_config(cfg)
    assert engine.vocab_size == 128256 and engine.device == "emulated h100-sxm x4"
    with pytest.raises(Exception, match="out of vocabulary"):
        engine.make_request("r", [128256], SamplingParams(), 0.0)


# -- a real emulated server against the simulator -------------------------------------------------
EMULATED = ("--emulate", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100-sxm", "-tp", "4")


def test_emulated_server_streams_words_from_a_fixed_vocabulary() -> None:
    server = ServerProcess(*EMULATED)
    try:
        c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        chat = c.chat.completions.create(model="meta-llama/Llama-3.1-70B", max_completion_tokens=8,
                                         messages=[{"role": "user", "content": "Hello there"}])
        text = chat.choices[0].message.content
        assert text is not None and text.startswith("The engine")
        assert chat.usage is not None and chat.usage.completion_tokens == 8
        models = c.models.list().data
        assert models[0].model_extra is not None
        assert models[0].model_extra["max_model_len"] == 131072
    finally:
        assert stop_and_check(server) == 0


@pytest.mark.parametrize("rate", [3.0])
def test_emulated_run_agrees_with_simulate(tmp_path: Path, rate: float) -> None:
    """The same request stream, served by the emulated server (a run directory) and simulated:
    what the emulation runs — the engine: admission and the model's step times on the real
    clock — agrees with the simulation: TTFT inside the engine (its enqueue to its first
    token) and TPOT, medians within 5% (0.2-1% apart when measured). The front end (arrival
    to the engine's enqueue) and the output path (the engine's first token to its delivery)
    are the real ones, HTTP, tokenization and IPC on whatever this machine has to spare, so
    they are measured and printed, not held to the model's figures: on a loaded 2-core
    machine they took 10-15 ms and 4-5 ms against the model's 6 ms and 0.1 ms, the served
    TTFT 97-108 ms against 94 ms."""
    workload_cfg = WorkloadConfig(dataset_name="random", num_prompts=16, request_rate=rate,
                                  random_input_len=1024, random_output_len=24, seed=3)
    sim_cfg = SimConfig(model="meta-llama/Llama-3.1-70B", gpu="h100-sxm",
                        tensor_parallel_size=4, workload=workload_cfg)
    workload = build_workload(workload_cfg)
    prompts = synthetic_prompts(workload, sim_cfg.model_spec.vocab_size, seed=3)
    record_dir = tmp_path / "served"
    server = ServerProcess(*EMULATED, "--record-dir", str(record_dir), "--no-plots")
    try:
        records = replay(server.base_url, prompts, [int(n) for n in workload.output_lens],
                         [float(t) for t in workload.send_time_s])
    finally:
        assert stop_and_check(server) == 0
    assert all(r.error is None for r in records), [r.error for r in records]
    served = pd.read_parquet(record_dir / "requests.parquet")
    assert served["success"].all() and len(served) == 16
    assert sorted(served["num_output_tokens"]) == sorted(int(n) for n in workload.output_lens)
    result = run_simulation(sim_cfg)
    simulated = build_tables(result.event_log).requests
    meta = json.loads((record_dir / "config.json").read_text())
    assert meta["mode"] == "emulated"
    assert meta["engine_config"] == json.loads(json.dumps({  # JSON: tuples read back as lists
        "scheduler": dataclasses.asdict(result.engine_config.scheduler),
        "cache": dataclasses.asdict(result.engine_config.cache),
    }))
    for table in (served, simulated):
        table["frontend_s"] = table["engine_enqueued_s"] - table["arrival_s"]
        table["engine_ttft_s"] = table["first_token_s"] - table["engine_enqueued_s"]
        table["output_s"] = table["ttft_s"] - table["frontend_s"] - table["engine_ttft_s"]
    medians = {m: (float(served[m].median()), float(simulated[m].median()))
               for m in ("ttft_s", "frontend_s", "engine_ttft_s", "output_s", "tpot_s")}
    print("served vs simulated medians (s):", medians)
    for table in (served, simulated):
        assert (table["frontend_s"] > 0).all() and (table["output_s"] >= 0).all()
    for metric in ("engine_ttft_s", "tpot_s"):
        real, sim = medians[metric]
        assert math.isclose(real, sim, rel_tol=0.05), (metric, real, sim)
