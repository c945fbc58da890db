"""The torch reference itself, cross-checked with scaled_dot_product_attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from kernel_cases import batch_specs

from kernels import attention_tolerance, paged_attention_reference, reshape_and_cache_reference
from kernels.paged_batch import BatchSpec, make_paged_batch
from kernels.reference import gather_kv


@settings(max_examples=40, deadline=None, derandomize=True)
@given(spec=batch_specs(max_seqs=3, max_query_len=32, max_context_len=64))
def test_reference_matches_sdpa_per_sequence(spec: BatchSpec) -> None:
    batch = make_paged_batch(spec)
    out = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())
    starts = batch.query_start_loc.tolist()
    tol = attention_tolerance(spec.dtype)
    for seq, seq_len in enumerate(spec.seq_lens):
        begin, end = starts[seq], starts[seq + 1]
        if begin == end:
            continue
        keys = gather_kv(batch.k_cache, batch.block_table[seq], seq_len).double()
        values = gather_kv(batch.v_cache, batch.block_table[seq], seq_len).double()
        q_len = end - begin
        mask = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len)
        expected = F.scaled_dot_product_attention(
            batch.query[begin:end].double().transpose(0, 1)[None],
            keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=mask, scale=batch.scale, enable_gqa=True,
        )[0].transpose(0, 1)
        torch.testing.assert_close(
            out[begin:end].double(), expected.to(spec.dtype).double(),
            atol=tol.atol, rtol=tol.rtol,
        )


def test_reference_padding_rows_are_zero_and_out_is_respected() -> None:
    spec = BatchSpec(
        query_lens=(2,), context_lens=(3,), num_q_heads=2, num_kv_heads=2, head_dim=8,
        block_size=2, num_padding_tokens=2,
    )
    batch = make_paged_batch(spec)
    out = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())
    assert (out[2:] == 0).all() and torch.isfinite(out).all()
    given_out = torch.full_like(batch.query, 5.0)
    result = paged_attention_reference(
        *batch.attention_args(), **batch.attention_kwargs(), out=given_out
    )
    assert result is given_out and (given_out[2:] == 5.0).all()
    torch.testing.assert_close(given_out[:2], out[:2])


def test_reference_cache_write_round_trips_through_gather() -> None:
    key = torch.arange(5 * 2 * 4, dtype=torch.float32).reshape(5, 2, 4)
    k_cache = torch.zeros(3, 2, 2, 4)
    v_cache = torch.zeros(3, 2, 2, 4)
    slots = torch.tensor([4, 5, 0, 1, -1])  # blocks 2 then 0, last token skipped
    reshape_and_cache_reference(key, -key, k_cache, v_cache, slots)
    table_row = torch.tensor([2, 0], dtype=torch.int32)
    torch.testing.assert_close(gather_kv(k_cache, table_row, 4), key[:4])
    torch.testing.assert_close(gather_kv(v_cache, table_row, 3), -key[:3])


def test_unknown_tolerance_dtype() -> None:
    with pytest.raises(ValueError, match="no attention tolerance"):
        attention_tolerance(torch.int8)
