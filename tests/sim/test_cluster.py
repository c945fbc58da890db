"""Routers on hand-made replica states, and data-parallel simulations."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.request import Request, SamplingParams
from sim.cluster import (
    RING_POINTS,
    LeastKVRouter,
    LeastOutstandingRouter,
    PrefixAwareRouter,
    ReplicaView,
    RoundRobinRouter,
    UnknownRouterError,
    VLLMRouter,
    check_router,
    consistent_hash_choices,
    random_choices,
    routing_keys,
)
from sim.config import SimConfig
from sim.runtime import run_simulation
from workload.config import WorkloadConfig

REQ = Request("r", sampling_params=SamplingParams(), num_prompt_tokens=100)


def view(i: int, out: int = 0, running: int = 0, waiting: int = 0, kv: float = 0.0,
         hit: int = 0) -> ReplicaView:
    return ReplicaView(i, out, running, waiting, kv, lambda req, h=hit: h)


def test_round_robin_cycles() -> None:
    r = RoundRobinRouter(3)
    assert [r.pick(seq) for seq in (7, 3, 9, 1, 0)] == [0, 1, 2, 0, 1]  # order, not seq


def test_random_router_is_seeded_uniform_and_per_request() -> None:
    a = random_choices(seed=0, num_requests=40_000, num_replicas=4)
    assert (a == random_choices(0, 40_000, 4)).all()
    assert not (a == random_choices(1, 40_000, 4)).all()
    assert np.abs(np.bincount(a, minlength=4) / 40_000 - 0.25).max() < 0.01


def test_consistent_hashing_keeps_a_prefix_home_and_moves_few_keys() -> None:
    from workload.build import build_workload

    w = build_workload(WorkloadConfig(dataset_name="prefix_repetition", num_prompts=400,
                                      prefix_repetition_num_prefixes=12))
    keys = routing_keys(w)
    choices = consistent_hash_choices(keys, 4)
    for prefix in np.unique(w.shared_prefix_ids):
        assert len(set(choices[w.shared_prefix_ids == prefix].tolist())) == 1
    # requests without a shared prefix each have their own key (and spread over replicas)
    many = np.arange(20_000, dtype=np.uint64)
    share = np.bincount(consistent_hash_choices(many, 8), minlength=8) / len(many)
    assert share.min() > 0.5 / 8 and share.max() < 1.5 / 8, (share, RING_POINTS)
    # a ninth replica takes keys only from the others: none moves between the first eight
    before, after = consistent_hash_choices(many, 8), consistent_hash_choices(many, 9)
    moved = before != after
    assert (after[moved] == 8).all() and 0.05 < moved.mean() < 0.2


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
    with pytest.raises(UnknownRouterError, match="valid: round_robin, random, consistent_hash"):
        check_router("nearest")


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


def test_a_closed_loop_client_wakes_for_an_earlier_delivery_of_another_replica() -> None:
    """With two replicas, one may report a delivery earlier than the one the closed-loop
    client already waits for; the client must wake for it (it slept on, and the engines,
    bounded by that release, spun at one instant forever). Found by fuzzing; both paths."""
    import signal

    from engine.core.config import EngineKnobs
    from engine.core.events import EventKind
    from sim.runtime import SimRuntime
    from tests.sim.helpers import LinearCostModel
    from workload.stream import Workload

    send = [0.00053, 0.0014, 0.006059, 0.006151, 0.008053, 0.013176, 0.013542, 0.013556,
            0.013894, 0.013932, 0.021259, 0.032923, 0.03735, 0.04363, 0.102211, 0.145508,
            0.179016, 0.180335, 0.196905, 0.201838, 0.227583, 0.229913, 0.233309, 0.25024,
            0.256891, 0.297723, 0.448206, 0.505118, 0.654564, 1.092773, 1.235607, 1.577294,
            1.767253, 1.894992, 1.991997, 2.658465]
    prompts = [23, 24, 16, 5, 22, 27, 20, 19, 37, 15, 20, 11, 23, 22, 28, 98, 16, 28, 28, 24,
               35, 9, 20, 22, 30, 34, 35, 19, 24, 26, 44, 15, 45, 30, 5, 172]
    outputs = [29, 46, 72, 6, 2, 2, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 2, 2, 1, 1, 1, 37, 76, 1, 1,
               2, 1, 2, 2, 45, 1, 1, 37, 1, 68, 1]
    priorities = [0, 3, 2, 3, 3, 2, 3, 1, 0, 3, 3, 1, 3, 0, 1, 1, 1, 2, 0, 1, 0, 3, 0, 0, 1, 2,
                  3, 3, 1, 0, 0, 1, 2, 3, 1, 3]
    prefix_ids = [-1, 0, 1, 1, 0, 1, 2, 1, -1, 2, 0, 1, 0, 2, 1, -1, 1, 1, -1, 0, 2, 0, 1, 0, 0,
                  0, 2, 0, -1, 2, 1, 0, -1, 1, -1, -1]
    prefix_lens = [16, 20, 4, 4, 20, 24, 20, 8, 4, 12, 16, 4, 16, 20, 20, 12, 16, 16, 24, 20, 24,
                   4, 12, 16, 24, 32, 28, 16, 28, 24, 32, 4, 16, 28, 32, 24]
    w = Workload(
        send_time_s=np.asarray(send), prompt_lens=np.asarray(prompts, dtype=np.int64),
        output_lens=np.asarray(outputs, dtype=np.int64),
        priorities=np.asarray(priorities, dtype=np.int64),
        shared_prefix_ids=np.asarray(prefix_ids, dtype=np.int64),
        shared_prefix_lens=np.asarray(prefix_lens, dtype=np.int64),
        max_concurrency=2, source="hand-built",
    )
    engine = EngineKnobs(max_num_batched_tokens=512, max_num_seqs=1,
                         long_prefill_token_threshold=8, policy="priority", block_size=4)

    def timeout(*_: object) -> None:
        raise TimeoutError("the simulation did not finish")

    previous = signal.signal(signal.SIGALRM, timeout)
    try:
        logs = []
        for fast_path in (False, True):
            signal.alarm(60)
            cfg = SimConfig(engine=engine, num_gpu_blocks=131, max_model_len=512,
                            fast_path=fast_path, data_parallel_size=2, router="prefix_aware")
            result = SimRuntime(cfg, workload=w, cost_model=LinearCostModel()).run()
            signal.alarm(0)
            log = result.event_log
            kinds = list(log.events_columns()["kind"])  # type: ignore[call-overload]
            assert kinds.count(EventKind.DELIVERED) == 36  # every request came back
            logs.append((list(log.steps_columns()["update_time_s"]),  # type: ignore[call-overload]
                         sorted(log.delivered_times().items())))
        assert logs[0] == logs[1]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_request_tokenized_sooner_is_routed_then() -> None:
    """With two API servers a request sent later can leave them sooner; the router must route
    it at that time, not when the earlier-sent request is ready (it slept until then)."""
    from engine.core.events import EventKind
    from sim.runtime import SimRuntime
    from workload.stream import Workload

    ones = np.ones(2, dtype=np.int64)
    w = Workload(
        send_time_s=np.asarray([0.0, 0.001]), prompt_lens=np.asarray([4000, 10]),
        output_lens=4 * ones, priorities=0 * ones, shared_prefix_ids=-ones,
        shared_prefix_lens=0 * ones, max_concurrency=None, source="hand-built",
    )
    cfg = SimConfig.from_dict({"data_parallel_size": 2, "router": "least_outstanding",
                               "frontend": {"num_api_servers": 2}})
    log = SimRuntime(cfg, workload=w).run().event_log
    times: dict[tuple[str, EventKind], float] = {}
    for e in log.iter_events(expand_tokens=False):
        times.setdefault((e.req_id, e.kind), e.time_s)
    tokenized = {r: times[r, EventKind.TOKENIZED] for r in ("0", "1")}
    assert tokenized["1"] < tokenized["0"]
    ipc = cfg.frontend.ipc_latency_s
    for r in ("0", "1"):  # each reaches its idle engine straight from the router
        assert times[r, EventKind.ENGINE_ENQUEUED] == tokenized[r] + ipc
