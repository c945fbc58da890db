"""Split-KV decode: equal to the reference, to the unsplit decode and to the unified kernel."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import assert_close_to, batch_specs, real_rows

from kernels import (
    AttentionKernel,
    paged_attention,
    paged_attention_reference,
    plan_for,
)
from kernels.paged_batch import BatchSpec, PagedBatch, make_paged_batch
from kernels.selection import TileConfig, next_power_of_2
from kernels.triton_decode import decode_attention
from kernels.triton_unified import unified_attention
from kernels.validation import AttentionDims, validate_attention_inputs


def _decode(
    batch: PagedBatch, dims: AttentionDims, num_splits: int, config: TileConfig
) -> torch.Tensor:
    out = torch.full_like(batch.query, 7.0)
    return decode_attention(
        *batch.attention_args(), out, dims=dims, scale=batch.scale, num_splits=num_splits,
        config=config,
    )


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_split_equals_unsplit_equals_unified_equals_reference(data: st.DataObject) -> None:
    spec = data.draw(batch_specs(decode_only=True, max_seqs=3, max_context_len=72))
    q_per_kv = spec.num_q_heads // spec.num_kv_heads
    config = TileConfig(
        block_m=max(16, next_power_of_2(q_per_kv)),
        tile_size=data.draw(st.sampled_from((16, 32))),
        num_warps=4,
        num_stages=2,
    )
    num_splits = data.draw(st.sampled_from((2, 3, 5, 8)))
    batch = make_paged_batch(spec)
    dims = validate_attention_inputs(*batch.attention_args(), **batch.attention_kwargs())
    rows = real_rows(batch)
    expected = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())

    unsplit = _decode(batch, dims, 1, config)
    split = _decode(batch, dims, num_splits, config)
    unified = unified_attention(
        *batch.attention_args(), torch.full_like(batch.query, 7.0), dims=dims,
        scale=batch.scale, config=config,
    )
    assert_close_to(unsplit[:rows], expected[:rows], spec.dtype)
    assert_close_to(split[:rows], unsplit[:rows], spec.dtype)
    assert_close_to(unified[:rows], unsplit[:rows], spec.dtype)
    for out in (unsplit, split, unified):
        assert (out[rows:] == 7.0).all(), "padding rows were written"


def test_split_decode_on_fp32_is_tight() -> None:
    """Splitting only regroups an fp32 sum: a long context split 7 ways stays within 1e-5."""
    spec = BatchSpec(
        query_lens=(1, 1), context_lens=(150, 97), num_q_heads=4, num_kv_heads=1, head_dim=32,
        block_size=16, dtype=torch.float32, seed=9,
    )
    batch = make_paged_batch(spec)
    dims = validate_attention_inputs(*batch.attention_args(), **batch.attention_kwargs())
    config = TileConfig(block_m=16, tile_size=16, num_warps=4, num_stages=2)
    unsplit = _decode(batch, dims, 1, config)
    split = _decode(batch, dims, 7, config)
    torch.testing.assert_close(split, unsplit, atol=1e-6, rtol=1e-5)


def test_public_path_splits_when_the_bound_is_long() -> None:
    """A large host-side max_seq_len makes paged_attention split (most splits are empty)."""
    spec = BatchSpec(
        query_lens=(1, 0, 1), context_lens=(40, 5, 3), num_q_heads=8, num_kv_heads=2,
        head_dim=16, block_size=32, dtype=torch.float16, extra_blocks_per_seq=64, seed=2,
    )
    batch = make_paged_batch(spec)
    kwargs = batch.attention_kwargs() | {"max_seq_len": 2048}
    dims = validate_attention_inputs(*batch.attention_args(), **kwargs)
    plan = plan_for(dims, batch.query.device)
    assert plan.kernel is AttentionKernel.DECODE
    assert plan.num_splits == 4
    out = paged_attention(*batch.attention_args(), **kwargs, backend="triton")
    expected = paged_attention_reference(*batch.attention_args(), **kwargs)
    rows = real_rows(batch)
    # Sequence 1 has no query token: only rows of sequences 0 and 2 exist.
    assert rows == 2
    assert_close_to(out[:rows], expected[:rows], spec.dtype)


def test_decode_launcher_rejects_prefill_batches() -> None:
    spec = BatchSpec(
        query_lens=(2,), context_lens=(3,), num_q_heads=2, num_kv_heads=1, head_dim=16,
        block_size=4,
    )
    batch = make_paged_batch(spec)
    dims = validate_attention_inputs(*batch.attention_args(), **batch.attention_kwargs())
    config = TileConfig(block_m=16, tile_size=16, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match="decode-only"):
        _decode(batch, dims, 1, config)
