"""Routers on hand-made replica states, and data-parallel simulations."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.request import Request, SamplingParams
from sim.cluster import (
    LeastKVRouter,
    LeastOutstandingRouter,
    PrefixAwareRouter,
    ReplicaView,
    RoundRobinRouter,
    UnknownRouterError,
    VLLMRouter,
    make_router,
)
from sim.config import SimConfig
from sim.runtime import run_simulation
from sim.workload import WorkloadConfig

REQ = Request("r", sampling_params=SamplingParams(), num_prompt_tokens=100)


def view(i: int, out: int = 0, running: int = 0, waiting: int = 0, kv: float = 0.0,
         hit: int = 0) -> ReplicaView:
    return ReplicaView(i, out, running, waiting, kv, lambda req, h=hit: h)


def test_round_robin_cycles() -> None:
    r = RoundRobinRouter()
    views = [view(0), view(1), view(2)]
    assert [r.choose(REQ, views) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_outstanding_and_least_kv() -> None:
    views = [view(0, out=3, kv=0.1), view(1, out=1, kv=0.9), view(2, out=1, kv=0.5)]
    assert LeastOutstandingRouter().choose(REQ, views) == 1  # tie on 1 -> lower index
    assert LeastKVRouter().choose(REQ, views) == 0


def test_prefix_aware_prefers_the_longest_hit_within_the_load_cap() -> None:
    views = [view(0, out=2, hit=0), view(1, out=5, hit=64), view(2, out=20, hit=96)]
    assert PrefixAwareRouter(load_cap=4).choose(REQ, views) == 1  # replica 2 is overloaded
    assert PrefixAwareRouter(load_cap=100).choose(REQ, views) == 2
    no_hits = [view(0, out=2), view(1, out=1)]
    assert PrefixAwareRouter().choose(REQ, no_hits) == 1  # falls back to least loaded


def test_vllm_balancer_score() -> None:
    # score = max(in flight, waiting + running) + waiting * 6 * max(0, kv - 0.5)
    views = [view(0, out=2, running=2, waiting=2, kv=1.0),  # 4 + 2*6*0.5 = 10
             view(1, out=5, running=4, waiting=0, kv=0.9),  # 5
             view(2, out=1, running=3, waiting=3, kv=0.5)]  # 6 + 0
    assert VLLMRouter().choose(REQ, views) == 1


def test_unknown_router() -> None:
    with pytest.raises(UnknownRouterError, match="valid: round_robin"):
        make_router("random")


def _shared_prefix_run(router: str) -> tuple[float, float]:
    res = run_simulation(SimConfig(
        data_parallel_size=4, router=router, num_gpu_blocks=1200, max_model_len=8192,
        workload=WorkloadConfig(
            dataset_name="prefix_repetition", num_prompts=320, request_rate=16,
            prefix_repetition_prefix_len=4096, prefix_repetition_suffix_len=64,
            prefix_repetition_num_prefixes=32, prefix_repetition_output_len=16),
    ))
    from reports.tables import build_tables

    q = build_tables(res.event_log).requests
    return float(q.prefix_hit_tokens.sum() / q.num_prompt_tokens.sum()), float(q.ttft_s.mean())


def test_prefix_aware_beats_round_robin_on_shared_prefixes() -> None:
    # 32 prefixes of 4096 tokens, 4 replicas each holding ~4.7 prefixes: round robin makes every
    # replica cache every prefix (thrashing); prefix-aware routing keeps each prefix home.
    rr_hit, rr_ttft = _shared_prefix_run("round_robin")
    pa_hit, pa_ttft = _shared_prefix_run("prefix_aware")
    assert pa_hit > 2 * rr_hit
    assert pa_ttft < 0.85 * rr_ttft


def test_data_parallel_spreads_load_and_uses_every_replica() -> None:
    res = run_simulation(SimConfig(
        data_parallel_size=3, router="least_outstanding",
        workload=WorkloadConfig(dataset_name="random", num_prompts=90, request_rate=30,
                                random_input_len=256, random_output_len=32)))
    steps = res.event_log.steps_columns()
    per_replica = np.bincount(np.asarray(steps["replica"]))
    assert len(per_replica) == 3 and (per_replica > 0).all()
    ids = np.sort(np.asarray(steps["step_id"]))
    assert (ids == np.arange(len(ids))).all()  # dense ids after the run
