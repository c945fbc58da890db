"""Simulations under every shipped scheduling policy: the bulk fast path stays exact (or keeps
out of the way), nothing is lost (every request is delivered or rejected with a reason), the
labels reach the event records, and the run metadata names the policy and what the fast path
did with it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.config import ConfigError, EngineKnobs
from engine.core.events import EventKind
from engine.core.slo import SLOClass
from sim.config import SimConfig
from sim.runtime import SimResult, SimRuntime
from tests.sim.helpers import SIMPLE_FRONTEND, LinearCostModel, workload
from tests.sim.test_runtime_properties import _log_columns
from workload.config import WorkloadConfig
from workload.stream import Workload

CLASSES = (SLOClass("chat", 0.05, 0.01), SLOClass("batch", 5.0, 0.2))
#: Every shipped policy but vLLM's two (the golden replays cover those), with options.
POLICIES = [
    ("sjf", {}), ("sjf", {"predictor": "bucket", "num_buckets": 4}),
    ("srpt", {"predictor": "noisy"}), ("edf", {}), ("vtc", {}),
    ("decode-first", {"chunk": 16}), ("prefill-first", {"chunk": 16}), ("shed", {}),
]


def labelled(w: Workload, tenants: list[int], classes: list[int]) -> Workload:
    return dataclasses.replace(
        w, tenants=("a", "b"), tenant_ids=np.asarray(tenants, dtype=np.int32),
        slo_classes=CLASSES, slo_class_ids=np.asarray(classes, dtype=np.int32),
    )


def run(w: Workload, engine: EngineKnobs, *, fast_path: bool = True, blocks: int = 200,
        conc: int | None = None) -> SimResult:
    cfg = SimConfig(engine=engine, frontend=SIMPLE_FRONTEND, num_gpu_blocks=blocks,
                    max_model_len=200, fast_path=fast_path,
                    workload=WorkloadConfig(slo_classes=(("chat", 50, 10), ("batch", 5000, 200)),
                                            slo_class_mix=(("chat", 0.5), ("batch", 0.5))))
    return SimRuntime(cfg, workload=w, cost_model=LinearCostModel()).run()


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[EngineKnobs, int, Workload]:
    n = draw(st.integers(1, 25))
    sends = sorted(draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    prompts = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    max_seqs = draw(st.sampled_from([2, 4, 16]))
    policy, options = draw(st.sampled_from(POLICIES))
    engine = EngineKnobs(
        async_scheduling=draw(st.booleans()),
        max_num_batched_tokens=max(max_seqs, draw(st.sampled_from([16, 64, 512]))),
        max_num_seqs=max_seqs, block_size=draw(st.sampled_from([4, 16])),
        enable_prefix_caching=draw(st.booleans()), policy=policy, policy_options=options,
    )
    conc = draw(st.sampled_from([None, None, 3]))
    w = labelled(workload(sends, prompts, outputs, max_concurrency=conc),
                 draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)),
                 draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    return engine, draw(st.sampled_from([60, 200, 2000])), w


SETTINGS = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(scenarios())
def test_the_fast_path_changes_nothing_under_any_shipped_policy(sc: tuple) -> None:
    engine, blocks, w = sc
    fast = run(w, engine, blocks=blocks)
    slow = run(w, engine, blocks=blocks, fast_path=False)
    assert _log_columns(fast) == _log_columns(slow)
    assert fast.reject_reasons == slow.reject_reasons
    if engine.policy in ("edf", "prefill-first"):
        assert fast.stats.num_bulk_steps == 0  # they declare no running order: no bulk runs


@SETTINGS
@given(scenarios())
def test_every_request_is_delivered_or_rejected_with_its_labels_recorded(sc: tuple) -> None:
    engine, blocks, w = sc
    res = run(w, engine, blocks=blocks)
    ev = res.event_log.events_columns()
    kinds, reqs = np.asarray(ev["kind"]), np.asarray(ev["req_index"])
    n = len(w)
    done = np.bincount(reqs[kinds == EventKind.DELIVERED], minlength=n)
    rejected = np.bincount(reqs[kinds == EventKind.REJECTED], minlength=n)
    assert ((done + rejected) == 1).all()
    assert res.stats.num_rejected == int(rejected.sum()) == len(res.reject_reasons)
    log = res.event_log
    labels = log.labels_columns()
    assert len(labels["req_index"]) == n
    for idx, tenant, slo in zip(*labels.values(), strict=True):
        i = int(log.req_ids[idx])
        assert tenant == w.tenant(i) and slo == w.slo_class(i).name  # type: ignore[union-attr]


def test_shed_rejects_tight_requests_under_a_burst_and_the_rest_are_served() -> None:
    # 20 requests at once, 10 × chat (TTFT 50 ms), 10 × batch (5 s); steps of 10 ms + 1 ms per
    # token; chat requests that would wait past 50 ms are shed, batch ones all run
    n = 20
    w = labelled(workload([0.0] * n, [60] * n, [10] * n), [0, 1] * 10, [0, 1] * 10)
    res = run(w, EngineKnobs(async_scheduling=False, max_num_seqs=4, policy="shed"))
    shed = {int(r) for r in res.reject_reasons}
    assert shed and all(i % 2 == 0 for i in shed)  # only chat requests
    assert all(r.startswith("shed: predicted TTFT") for r in res.reject_reasons.values())
    fcfs = run(w, EngineKnobs(async_scheduling=False, max_num_seqs=4))
    assert not fcfs.reject_reasons


def test_the_metadata_names_the_policy_and_what_the_fast_path_did() -> None:
    w = labelled(workload([0.0], [10], [3]), [0], [1])
    res = run(w, EngineKnobs(policy="decode-first", policy_options={"chunk": 64}))
    assert res.scheduling_policy == {
        "name": "decode-first", "class": "engine.policies.sarathi:DecodeFirst",
        "options": {"chunk": 64},
        "bulk_fast_path": "limited: policy 'decode-first' does not declare chunking; no bulk "
                          "run plans an admission, and none includes a prefill chunk",
    }
    assert run(w, EngineKnobs(), fast_path=False).scheduling_policy["bulk_fast_path"] == (
        "off (fast_path = false)"
    )
    from experiments.run_meta import simulated_run_meta

    assert simulated_run_meta(res).to_dict()["scheduling_policy"] == res.scheduling_policy


def test_a_policy_that_needs_slos_on_a_workload_without_them_is_refused_up_front() -> None:
    with pytest.raises(ConfigError, match="'edf' needs per-request SLOs"):
        SimConfig(engine=EngineKnobs(policy="edf"))
    SimConfig(engine=EngineKnobs(policy="edf"),
              workload=WorkloadConfig(slo_classes=(("all", 500, 50),)))
