"""reshape_and_cache: the Triton copy equals the reference, bit for bit; -1 slots are skipped."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import DTYPES

from kernels import AttentionBackend, reshape_and_cache, reshape_and_cache_reference


@st.composite
def cache_writes(draw: st.DrawFn) -> dict[str, object]:
    num_blocks = draw(st.integers(1, 6))
    block_size = draw(st.sampled_from((1, 4, 16)))
    num_kv_heads = draw(st.sampled_from((1, 2, 3)))
    head_dim = draw(st.sampled_from((8, 24, 64)))
    num_slots = num_blocks * block_size
    num_tokens = draw(st.integers(0, min(num_slots, 10)))
    slots = draw(st.permutations(range(num_slots)))[:num_tokens]
    skipped = draw(st.lists(st.booleans(), min_size=num_tokens, max_size=num_tokens))
    return {
        "shape": (num_blocks, block_size, num_kv_heads, head_dim),
        "slots": [-1 if skip else slot for slot, skip in zip(slots, skipped, strict=True)],
        "dtype": draw(st.sampled_from(DTYPES)),
        "fused": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _inputs(case: dict[str, object]) -> tuple[torch.Tensor, ...]:
    num_blocks, block_size, num_kv_heads, head_dim = case["shape"]  # type: ignore[misc]
    dtype = case["dtype"]
    gen = torch.Generator().manual_seed(case["seed"])  # type: ignore[arg-type]
    num_tokens = len(case["slots"])  # type: ignore[arg-type]
    fused = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=gen).to(dtype)
    if case["fused"]:  # key/value as strided views of a fused QKV output
        key, value = fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]
    else:
        key, value = fused[:, :num_kv_heads].clone(), fused[:, num_kv_heads:2 * num_kv_heads]
        value = value.clone()
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                         dtype=dtype)  # type: ignore[arg-type]
    slot_mapping = torch.tensor(case["slots"], dtype=torch.int64)
    return key, value, k_cache, k_cache.clone(), slot_mapping


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=cache_writes())
def test_triton_copy_equals_reference(case: dict[str, object]) -> None:
    key, value, k_cache, v_cache, slot_mapping = _inputs(case)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reshape_and_cache_reference(key, value, k_ref, v_ref, slot_mapping)
    reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, backend=AttentionBackend.TRITON)
    torch.testing.assert_close(k_cache, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, rtol=0, atol=0, equal_nan=True)


def test_skipped_slots_leave_the_cache_untouched() -> None:
    key = torch.ones(3, 1, 8)
    value = torch.full((3, 1, 8), 2.0)
    k_cache = torch.zeros(2, 4, 1, 8)
    v_cache = torch.zeros(2, 4, 1, 8)
    slot_mapping = torch.tensor([5, -1, 0], dtype=torch.int64)
    reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, backend="triton")
    written = torch.zeros(2, 4, dtype=torch.bool)
    written[1, 1] = written[0, 0] = True
    assert (k_cache[written] == 1.0).all() and (v_cache[written] == 2.0).all()
    assert (k_cache[~written] == 0.0).all() and (v_cache[~written] == 0.0).all()


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_out_of_range_slot_is_rejected_on_cpu(backend: str) -> None:
    key = torch.ones(1, 1, 8)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="slot_mapping holds slot 8"):
        reshape_and_cache(key, key, cache, cache.clone(), torch.tensor([8]), backend=backend)
    with pytest.raises(ValueError, match="only -1 marks"):
        reshape_and_cache(key, key, cache, cache.clone(), torch.tensor([-2]), backend=backend)
