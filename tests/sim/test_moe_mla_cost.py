"""Physics of the mixture-of-experts, expert-parallel, MLA and sliding-window step costs, and
the bulk fast path's exactness under them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.outputs import BatchShape
from sim.config import SimConfig, kv_capacity
from sim.cost.kernel_tables import load_tables
from sim.cost.moe import MoECost, MoELayout, touched_experts
from sim.cost.roofline import RooflineCostModel
from sim.cost.vllm_step import VllmStepCostModel
from sim.hardware import get_gpu
from sim.model_catalog import get_model
from sim.runtime import make_cost_model

H100, H200 = get_gpu("h100-sxm"), get_gpu("h200-sxm")


def decode(n: int, ctx: int) -> BatchShape:
    return BatchShape(n, n, (), (), n, n * ctx, ctx, n)


def prefill(q: int, ctx: int = 0) -> BatchShape:
    return BatchShape(1, q, (q,), (ctx,), 0, 0, 0, 1)


def term(model: VllmStepCostModel, shape: BatchShape, name: str) -> float:
    return dict(model.step_time(shape).terms)[name]


# -- touched experts ------------------------------------------------------------------------------
@pytest.mark.parametrize(("experts", "k", "tokens", "expected"), [
    (8, 2, 1, 2.0), (8, 2, 4, 5.5), (8, 2, 16, 7.9), (128, 8, 16, 82.4), (256, 8, 64, 222.4),
    (128, 4, 32, 81.7),
])
def test_touched_experts_closed_form(experts: int, k: int, tokens: int, expected: float) -> None:
    assert touched_experts(experts, k, tokens) == pytest.approx(expected, abs=0.05)


def test_a_decode_batch_reads_only_the_experts_it_touches() -> None:
    """Roofline: one token reads its top-k experts' weights, as a model with only those k
    experts would; a prefill reads all 128; in between the time follows the touched count."""
    m = get_model("qwen3-30b-a3b")
    only_k = dataclasses.replace(m, num_experts=8)
    roof, roof_k = RooflineCostModel(m, H200), RooflineCostModel(only_k, H200)
    router = roof._gemm_time(1, m.hidden_size, 128) - roof_k._gemm_time(1, m.hidden_size, 8)
    assert roof._layer_time(1, True) - router == pytest.approx(roof_k._layer_time(1, True))
    times = [roof._layer_time(t, True) for t in (1, 4, 16, 64)]
    assert times == sorted(times)
    # 64 tokens touch ~126 of 128 experts: memory bound, ~16× the weights of 8 experts
    assert roof._layer_time(64, True) > 4 * roof_k._layer_time(64, True)


def test_moe_experts_follow_the_measured_fused_kernel_where_measured() -> None:
    mixtral = VllmStepCostModel(get_model("mixtral-8x7b"), H200, 2)
    assert mixtral.moe.source.startswith("measured fused MoE (bfloat16, MoE TP 2 EP 1")
    curve = load_tables("h200_sxm").moe_curve("bfloat16", mixtral.moe.shape, 2, 1)
    assert curve is not None
    assert mixtral.moe.experts_s(64) == pytest.approx(curve.at(64) * 1e-6)
    # decode batches are cheap per token, prefill is compute bound: time grows with tokens
    times = [term(mixtral, decode(n, 512), "moe.experts") for n in (1, 8, 64, 256)]
    assert times == sorted(times) and times[-1] > 1.5 * times[0]


def test_unmeasured_shapes_use_the_grouped_gemm_efficiency() -> None:
    m = VllmStepCostModel(get_model("Qwen/Qwen2-57B-A14B"), H100)
    assert m.moe.source.startswith("estimate: touched experts")
    times = [m.moe.experts_s(n) for n in (1, 2, 8, 32, 128, 1024, 8192)]
    assert times == sorted(times)  # never cheaper with more tokens


def test_expert_parallel_adds_dispatch_and_spreads_expert_weights() -> None:
    one = SimConfig(model="qwen3-30b-a3b", gpu="h100-sxm", tensor_parallel_size=2)
    ep = SimConfig(model="qwen3-30b-a3b", gpu="h100-sxm", tensor_parallel_size=2,
                   data_parallel_size=4, enable_expert_parallel=True)
    assert ep.expert_parallel_size == ep.moe_shard_size == 8
    m = get_model("qwen3-30b-a3b")
    experts = m.routed_expert_params * m.expert_bytes
    # one TP-2 engine: each GPU holds half of every expert; EP over 8: an eighth, whole
    assert kv_capacity(one).weight_bytes - kv_capacity(ep).weight_bytes == pytest.approx(
        experts / 2 - experts / 8)
    assert kv_capacity(ep).num_gpu_blocks > kv_capacity(one).num_gpu_blocks
    one_model, ep_model = make_cost_model(one), make_cost_model(ep)
    assert isinstance(one_model, VllmStepCostModel) and isinstance(ep_model, VllmStepCostModel)
    assert term(one_model, decode(32, 1024), "moe.dispatch") == 0.0
    d32, d2048 = (term(ep_model, s, "moe.dispatch") for s in (decode(32, 1024), prefill(2048)))
    assert 0 < d32 < d2048
    assert "all_gather + reduce_scatter over 8 ranks" in ep_model.moe.comm_source
    a2a = make_cost_model(dataclasses.replace(ep, all2all_backend="alltoall"))
    assert isinstance(a2a, VllmStepCostModel) and "alltoall" in a2a.moe.comm_source
    # every rank computes its experts for all 4 DP ranks' tokens
    assert ep_model.moe.routed_tokens(32) == 128
    assert ep_model.moe.source.startswith("measured fused MoE (bfloat16, MoE TP 1 EP 8")


def test_data_parallel_moe_is_sharded_over_the_whole_world_as_vllm_does() -> None:
    """Without EP vLLM still shards a MoE layer over TP × DP (slices of every expert) and
    dispatches the DP ranks' tokens: the same bytes per GPU as EP, another kernel."""
    tp = SimConfig(model="qwen3-30b-a3b", gpu="h100-sxm", tensor_parallel_size=2,
                   data_parallel_size=4)
    ep = dataclasses.replace(tp, enable_expert_parallel=True)
    assert tp.moe_shard_size == 8 and tp.expert_parallel_size == 1
    assert kv_capacity(tp).weight_bytes == pytest.approx(kv_capacity(ep).weight_bytes)
    model = make_cost_model(tp)
    assert isinstance(model, VllmStepCostModel)
    assert model.moe.source.startswith("measured fused MoE (bfloat16, MoE TP 8 EP 1")
    assert term(model, decode(32, 1024), "moe.dispatch") > 0
    dense = SimConfig(model="llama-3.1-8b", data_parallel_size=4)
    assert dense.moe_shard_size == 1  # dense replicas stay independent


def test_expert_parallel_on_one_engine_has_no_dispatch() -> None:
    m = VllmStepCostModel(get_model("mixtral-8x7b"), H100, 8, expert_parallel=True)
    assert m.moe_layout.ep_size == 8 and m.moe.source.startswith(
        "measured fused MoE (bfloat16, MoE TP 1 EP 8")
    assert term(m, decode(16, 256), "moe.dispatch") == 0.0
    assert term(m, decode(16, 256), "allreduce") > 0  # the combine is the layer's all-reduce


def test_ep_beyond_the_measured_sizes_is_scaled() -> None:
    tables = load_tables("b200_sxm")
    model = get_model("qwen3-30b-a3b")
    cost = MoECost(model, tables, MoELayout(8), "bfloat16")  # MoE TP 8
    largest = max(tp for tp, ep in tables.moe_layouts("bfloat16", cost.shape) if ep == 1)
    assert largest < 8 and f"scaled by {largest}/8 (estimate)" in cost.source
    measured = MoECost(model, tables, MoELayout(largest), "bfloat16")
    assert cost.experts_s(4096) < measured.experts_s(4096)


# -- MLA --------------------------------------------------------------------------------------
def test_mla_uses_the_measured_module_where_measured() -> None:
    v3 = VllmStepCostModel(get_model("deepseek-v3"), H200, 8, weight_dtype="fp8")
    assert v3.attention.mla_module
    assert "measured MLA module (16 heads" in v3.attention.decode_source
    assert term(v3, decode(32, 2048), "gemm.qkv") == 0.0  # projections inside the module
    times = [term(v3, decode(32, c), "attention.decode") for c in (512, 8192, 65536)]
    assert times == sorted(times) and times[-1] > times[0]
    assert term(v3, decode(128, 2048), "attention.decode") > term(v3, decode(8, 2048),
                                                                   "attention.decode")


def test_mla_estimate_elsewhere_reads_the_latent() -> None:
    lite = VllmStepCostModel(get_model("deepseek-ai/DeepSeek-V2-Lite"), H100)
    assert not lite.attention.mla_module
    assert lite.attention.decode_source.startswith("estimate: MLA latent read")
    assert term(lite, decode(8, 1024), "gemm.qkv") > 0
    short, long_ = (term(lite, decode(64, c), "attention.decode") for c in (256, 16384))
    assert long_ > 3 * short


# -- sliding windows ----------------------------------------------------------------------------
def test_sliding_layers_attend_to_at_most_the_window() -> None:
    oss = get_model("openai/gpt-oss-120b")
    full = dataclasses.replace(oss, num_sliding_layers=0, sliding_window=0)
    a, b = VllmStepCostModel(oss, H200), VllmStepCostModel(full, H200)
    assert term(a, decode(64, 100), "attention.decode") == term(b, decode(64, 100),
                                                                 "attention.decode")
    long_a, long_b = (term(m, decode(64, 32768), "attention.decode") for m in (a, b))
    assert long_a < 0.7 * long_b
    pre_a, pre_b = (term(m, prefill(8192), "attention.prefill") for m in (a, b))
    assert pre_a < 0.7 * pre_b


# -- the bulk fast path stays exact -----------------------------------------------------------
_MODELS = {
    "mixtral-tp2": lambda: VllmStepCostModel(get_model("mixtral-8x7b"), H100, 2),
    "deepseek-v3-tp8": lambda: VllmStepCostModel(get_model("deepseek-v3"), H200, 8,
                                                 weight_dtype="fp8"),
    "v2-lite": lambda: VllmStepCostModel(get_model("deepseek-v2-lite"), H100),
    "gpt-oss": lambda: VllmStepCostModel(get_model("gpt-oss-120b"), H200),
    "qwen3-ep": lambda: VllmStepCostModel(get_model("qwen3-235b-a22b"), H200, 2,
                                          data_parallel_size=4, expert_parallel=True),
    "roofline-moe-ep": lambda: RooflineCostModel(get_model("qwen3-30b-a3b"), get_gpu("mi300x"),
                                                 2, expert_parallel=True,
                                                 data_parallel_size=2),
    "roofline-mla-swa": lambda: RooflineCostModel(get_model("gpt-oss-20b"), get_gpu("l4"), 4),
}
_BUILT: dict[str, object] = {}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(_MODELS)), n=st.integers(1, 600),
       ctx=st.integers(0, 40_000), spread=st.integers(0, 5000))
def test_decode_step_total_is_bit_identical(name: str, n: int, ctx: int, spread: int) -> None:
    if name not in _BUILT:
        _BUILT[name] = _MODELS[name]()
    model = _BUILT[name]
    shape = BatchShape(n, n, (), (), n, n * ctx + spread, ctx + spread, n)
    assert model.decode_step_total(n, n * ctx + spread, ctx + spread) == (  # type: ignore[attr-defined]
        model.step_time(shape).total_s)  # type: ignore[attr-defined]
