"""Simulated pipeline parallelism: an exact event log of a two-stage case computed by hand,
and the physics of the stage cost model (weight reads halve per stage, a send per
micro-batch, the queue deepens, bubbles appear)."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.config import ConfigError, EngineKnobs
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape
from sim.config import SimConfig, resolve_engine_config
from sim.cost.pipeline import PipelineCostModel, PipelineStepTime
from sim.cost.roofline import RooflineCostModel
from sim.network import get_network, stage_links
from sim.runtime import SimRuntime, make_cost_model
from tests.sim.helpers import SIMPLE_FRONTEND, events, workload


class TwoStages:
    """Each stage: 5 ms + 0.5 ms per scheduled token; the send between them: 1 ms."""

    def stage_times(self, shape: BatchShape) -> PipelineStepTime:
        if shape.num_tokens == 0:
            return PipelineStepTime((0.0, 0.0), (0.0,))
        stage = 0.005 + 0.0005 * shape.num_tokens
        return PipelineStepTime((stage, stage), (0.001,))

    def step_time(self, shape: BatchShape) -> StepTime:
        return StepTime(self.stage_times(shape).total_s)


def test_two_stage_pipeline_overlaps_two_micro_batches() -> None:
    # Budget 10: A's and B's 10-token prefills are two micro-batches. Step 0 (A) runs on stage
    # 0 at 1.5-11.5, is sent (12.5) and runs on stage 1 until 22.5; step 1 (B) is scheduled at
    # once (two batches in flight) and takes stage 0 at 12.5-22.5, stage 1 at 23.5-33.5. The
    # decodes (5.5 ms a stage) alternate: A's at 23.5 (stage 0 busy until then) -> 39, B's at
    # 33.5 -> 45.5, A's at 40 -> 52, B's at 46.5 -> 58.5. Deliveries +0.7.
    cfg = SimConfig(
        engine=EngineKnobs(max_num_batched_tokens=10, max_num_seqs=2),  # async: turned off
        frontend=dataclasses.replace(SIMPLE_FRONTEND, num_api_servers=2),
        num_gpu_blocks=1000, max_model_len=4096, pipeline_parallel_size=2,
    )
    r = SimRuntime(cfg, workload=workload([0.0, 0.0], [10, 10], [3, 3]),
                   cost_model=TwoStages()).run()
    engine_events = [e for e in events(r) if e[1] not in ("ARRIVAL", "FRONTEND_START",
                                                           "TOKENIZED")]
    assert engine_events == [
        ("0", "ENGINE_ENQUEUED", 0.0015, None),
        ("1", "ENGINE_ENQUEUED", 0.0015, None),
        ("0", "SCHEDULED", 0.0015, 0),
        ("1", "SCHEDULED", 0.0015, 0),
        ("0", "FIRST_TOKEN", 0.0225, None),
        ("0", "TOKEN", 0.0225, 0),
        ("1", "FIRST_TOKEN", 0.0335, None),
        ("1", "TOKEN", 0.0335, 1),
        ("0", "TOKEN", 0.039, 2),
        ("1", "TOKEN", 0.0455, 3),
        ("0", "TOKEN", 0.052, 4),
        ("0", "FINISHED", 0.052, "length"),
        ("0", "DELIVERED", 0.0527, None),
        ("1", "TOKEN", 0.0585, 5),
        ("1", "FINISHED", 0.0585, "length"),
        ("1", "DELIVERED", 0.0592, None),
    ]
    steps = r.event_log.steps_columns()
    spans = [(round(s, 9), round(e, 9)) for s, e, n in zip(
        steps["execute_start_s"], steps["execute_end_s"], steps["num_tokens"], strict=True) if n]
    assert spans == [(0.0015, 0.0225), (0.0125, 0.0335), (0.0235, 0.039), (0.0335, 0.0455),
                     (0.04, 0.052), (0.0465, 0.0585)]
    assert r.engine_config.max_concurrent_batches == 2
    assert not r.engine_config.scheduler.async_scheduling


def test_one_request_leaves_a_bubble_in_each_stage() -> None:
    # Alone, a request has one micro-batch in flight: its decode (5.5 ms a stage) runs on stage 0,
    # is sent (1 ms), runs on stage 1, and only then can its next token be scheduled. Each
    # stage works 5.5 ms of every 12 ms (a bubble of 6.5 ms): tokens at 22.5, 34.5, 46.5 ms.
    cfg = SimConfig(
        engine=EngineKnobs(max_num_batched_tokens=10, max_num_seqs=2),
        frontend=SIMPLE_FRONTEND, num_gpu_blocks=1000, max_model_len=4096,
        pipeline_parallel_size=2,
    )
    r = SimRuntime(cfg, workload=workload([0.0], [10], [3]), cost_model=TwoStages()).run()
    tokens = [e[2] for e in events(r) if e[1] == "TOKEN"]
    assert tokens == [0.0225, 0.0345, 0.0465]
    steps = r.event_log.steps_columns()
    spans = [(round(s, 9), round(e, 9)) for s, e, n in zip(
        steps["execute_start_s"], steps["execute_end_s"], steps["num_tokens"], strict=True) if n]
    assert spans == [(0.0015, 0.0225), (0.0225, 0.0345), (0.0345, 0.0465)]


def _shape(tokens: int, sampling: int) -> BatchShape:
    return BatchShape(sampling, tokens, (), (), sampling, 1000 * sampling, 1000, sampling)


def test_two_stages_halve_each_stages_weight_reads_and_add_a_send() -> None:
    cfg = SimConfig(model="meta-llama/Llama-3.1-8B", gpu="h100-sxm", cost_model="roofline",
                    pipeline_parallel_size=2)
    whole = RooflineCostModel(cfg.model_spec, cfg.gpu_spec)
    pipe = make_cost_model(cfg)
    assert isinstance(pipe, PipelineCostModel)
    assert pipe.partition == (16, 16)
    decode = _shape(8, 8)  # weight-read bound: linear time ~ weight bytes
    stages = pipe.stage_times(decode)
    layers_only = whole.step_time(_shape(8, 0)).linear_s
    # each stage reads half the layers' weights; the last one adds the LM head
    first = pipe._stages[0].step_time(_shape(8, 0)).linear_s
    assert first == pytest.approx(layers_only / 2, rel=1e-9)
    assert stages.stage_s[1] > stages.stage_s[0]  # LM head + sampler on the last stage
    # one send per micro-batch: 8 tokens x 4096 x 2 bytes over NVLink
    assert len(stages.send_s) == 1
    assert stages.send_s[0] == pytest.approx(6e-6 + 8 * 4096 * 2 / cfg.gpu_spec.link_bw_bytes_s)
    # the latency through the idle pipeline is the whole step plus the send
    assert stages.total_s == pytest.approx(
        whole.step_time(decode).total_s + whole.params.step_overhead_s
        + whole.params.per_request_overhead_s * 8 + stages.send_s[0], rel=1e-9)


def test_deeper_queue_and_bubbles() -> None:
    base = SimConfig(model="meta-llama/Llama-3.1-8B", gpu="h100-sxm", cost_model="roofline")
    assert resolve_engine_config(base).max_concurrent_batches == 2  # async scheduling
    four = dataclasses.replace(base, pipeline_parallel_size=4)
    engine = resolve_engine_config(four)
    assert engine.max_concurrent_batches == 4
    assert engine.pipeline_parallel_size == 4
    # per-stage KV: each stage holds a quarter of the layers' KV, so more blocks per GPU
    assert engine.cache.num_gpu_blocks > resolve_engine_config(base).cache.num_gpu_blocks


def test_stage_hops_cross_nodes_only_beyond_a_node() -> None:
    cfg = SimConfig(gpu="h100-sxm")
    ib = get_network("infiniband-ndr")
    inside = stage_links(cfg.gpu_spec, ib, 4, 2, 8)
    assert [link.kind for link in inside] == ["nvlink"]
    across = stage_links(cfg.gpu_spec, ib, 8, 2, 8)
    assert [link.kind for link in across] == ["infiniband-ndr"]
    mixed = stage_links(cfg.gpu_spec, ib, 4, 4, 8)  # stages 0-1 on node 0, 2-3 on node 1
    assert [link.kind for link in mixed] == ["nvlink", "infiniband-ndr", "nvlink"]
    with pytest.raises(ConfigError, match="exceeds the 8 GPUs of a node"):
        stage_links(cfg.gpu_spec, ib, 16, 2, 8)
    send = 4096 * 4096 * 2 / 8
    assert across[0].send_s(send) > inside[0].send_s(send)


def test_bad_pipeline_layouts() -> None:
    with pytest.raises(ConfigError, match=r"pipeline_parallel_size 33 exceeds .*32 decoder"):
        SimConfig(model="meta-llama/Llama-3.1-8B", pipeline_parallel_size=33)
    with pytest.raises(ConfigError, match="unknown network"):
        SimConfig(network="carrier-pigeon")
