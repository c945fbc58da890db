"""Roofline sanity against physics (docs/roofline.md §1)."""

from __future__ import annotations

import pytest

from engine.core.config import ConfigError
from engine.core.outputs import BatchShape
from sim.cost.roofline import RooflineCostModel
from sim.hardware import get_gpu
from sim.model_catalog import get_model

LLAMA8B = get_model("meta-llama/Llama-3.1-8B")
H100 = get_gpu("h100-sxm")


def decode(n: int, ctx: int) -> BatchShape:
    return BatchShape(n, n, (), (), n, n * ctx, ctx, n)


def prefill(q: int, ctx: int = 0) -> BatchShape:
    return BatchShape(1, q, (q,), (ctx,), 0, 0, 0, 1)


def test_decode_time_grows_with_context() -> None:
    m = RooflineCostModel(LLAMA8B, H100)
    times = [m.step_time(decode(32, ctx)).total_s for ctx in (128, 1024, 8192, 32768)]
    assert times == sorted(times) and times[-1] > 2 * times[0]


def test_small_decode_is_weight_read_bound() -> None:
    m = RooflineCostModel(LLAMA8B, H100)
    t = m.step_time(decode(1, 100))
    weights_s = LLAMA8B.weight_bytes / (H100.memory_bw_bytes_s * H100.memory_efficiency)
    # one token reads all weights once: the linear layers take about the weight-read time
    assert t.linear_s == pytest.approx(weights_s, rel=0.15)
    # and doubling the batch barely changes it (memory bound, not compute bound)
    assert m.step_time(decode(2, 100)).linear_s < 1.02 * t.linear_s


def test_large_prefill_is_compute_bound() -> None:
    m = RooflineCostModel(LLAMA8B, H100)
    t = m.step_time(prefill(8192)).linear_s
    flops = 2 * 8192 * LLAMA8B.num_layers * (LLAMA8B.attn_params + LLAMA8B.mlp_params)
    compute_s = flops / (H100.peak_flops * H100.compute_efficiency)
    assert t == pytest.approx(compute_s, rel=0.1)
    # compute bound: twice the tokens, about twice the time
    assert m.step_time(prefill(16384)).linear_s == pytest.approx(2 * t, rel=0.05)


def test_crossover_from_memory_to_compute_bound() -> None:
    m = RooflineCostModel(LLAMA8B, H100)
    per_token = [m.step_time(prefill(t)).linear_s / t for t in (16, 64, 256, 1024, 4096)]
    assert per_token == sorted(per_token, reverse=True)  # cheaper per token as batches grow
    assert per_token[0] > 10 * per_token[-1]


def test_tp2_halves_linear_time_plus_communication() -> None:
    big = get_model("meta-llama/Llama-3.1-70B")
    tp1 = RooflineCostModel(big, H100, 1)
    tp2 = RooflineCostModel(big, H100, 2)
    for shape in (prefill(4096), decode(64, 1000)):
        a, b = tp1.step_time(shape), tp2.step_time(shape)
        assert b.linear_s == pytest.approx(a.linear_s / 2, rel=0.12)
        assert a.communication_s == 0 and b.communication_s > 0
        assert b.total_s < a.total_s


def test_bad_tensor_parallel_size() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        RooflineCostModel(LLAMA8B, H100, 3)


def test_decode_step_total_is_bit_identical_to_step_time() -> None:
    m = RooflineCostModel(get_model("meta-llama/Llama-2-70b-hf"), get_gpu("a100-80gb"), 2)
    for n, ctx_sum in [(1, 0), (7, 12345), (128, 10**6)]:
        assert m.decode_step_total(n, ctx_sum, ctx_sum) == m.step_time(
            BatchShape(n, n, (), (), n, ctx_sum, ctx_sum, n)).total_s
