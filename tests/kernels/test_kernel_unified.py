"""The unified varlen kernel against the fp32 reference (Triton interpreter, CPU tensors)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import assert_close_to, batch_specs, real_rows, tile_configs

from kernels import AttentionBackend, paged_attention, paged_attention_reference
from kernels.paged_batch import BatchSpec, PagedBatch, make_paged_batch
from kernels.reference import gather_kv
from kernels.selection import TileConfig
from kernels.triton_unified import unified_attention
from kernels.validation import validate_attention_inputs

SENTINEL = 7.0  # pre-filled into outputs: padding rows must keep it


def _run_unified(batch: PagedBatch, config: TileConfig | None) -> torch.Tensor:
    dims = validate_attention_inputs(*batch.attention_args(), **batch.attention_kwargs())
    out = torch.full_like(batch.query, SENTINEL)
    return unified_attention(
        *batch.attention_args(), out, dims=dims, scale=batch.scale, config=config
    )


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_unified_matches_reference_on_mixed_batches(data: st.DataObject) -> None:
    spec = data.draw(batch_specs())
    config = data.draw(tile_configs(spec.num_q_heads // spec.num_kv_heads))
    batch = make_paged_batch(spec)
    out = _run_unified(batch, config)
    expected = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())
    rows = real_rows(batch)
    assert_close_to(out[:rows], expected[:rows], spec.dtype)
    assert (out[rows:] == SENTINEL).all(), "padding rows were written"


def test_chunked_prefill_over_cached_context_spans_many_query_blocks() -> None:
    spec = BatchSpec(
        query_lens=(37, 1, 5), context_lens=(29, 40, 0), num_q_heads=4, num_kv_heads=2,
        head_dim=32, block_size=8, dtype=torch.float16, num_padding_tokens=2, seed=3,
    )
    batch = make_paged_batch(spec)
    out = _run_unified(batch, TileConfig(block_m=16, tile_size=16, num_warps=4, num_stages=2))
    expected = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())
    rows = real_rows(batch)
    assert_close_to(out[:rows], expected[:rows], spec.dtype)


def test_public_path_matches_sdpa_on_a_mixed_batch() -> None:
    spec = BatchSpec(
        query_lens=(9, 1, 16), context_lens=(7, 30, 0), num_q_heads=6, num_kv_heads=2,
        head_dim=16, block_size=4, dtype=torch.float32, seed=11,
    )
    batch = make_paged_batch(spec)
    out = paged_attention(
        *batch.attention_args(), **batch.attention_kwargs(), backend=AttentionBackend.TRITON
    )
    starts = batch.query_start_loc.tolist()
    for seq, seq_len in enumerate(spec.seq_lens):
        begin, end = starts[seq], starts[seq + 1]
        expected = _sdpa_one_sequence(batch, seq, seq_len, begin, end)
        assert_close_to(out[begin:end], expected, spec.dtype)


def _sdpa_one_sequence(
    batch: PagedBatch, seq: int, seq_len: int, begin: int, end: int
) -> torch.Tensor:
    """SDPA over the gathered K/V with a bottom-right-aligned causal mask."""
    keys = gather_kv(batch.k_cache, batch.block_table[seq], seq_len).float().transpose(0, 1)
    values = gather_kv(batch.v_cache, batch.block_table[seq], seq_len).float().transpose(0, 1)
    query = batch.query[begin:end].float().transpose(0, 1)  # [heads, q_len, head_dim]
    q_len = end - begin
    positions = torch.arange(seq_len - q_len, seq_len)
    mask = torch.arange(seq_len)[None, :] <= positions[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        query[None], keys[None], values[None], attn_mask=mask, scale=batch.scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def test_strided_query_and_out_views() -> None:
    """query sliced out of a fused QKV buffer, out a view with a padded head stride."""
    spec = BatchSpec(
        query_lens=(6, 1), context_lens=(10, 17), num_q_heads=4, num_kv_heads=2,
        head_dim=16, block_size=8, dtype=torch.bfloat16, seed=5,
    )
    batch = make_paged_batch(spec)
    num_tokens = batch.query.shape[0]
    fused = torch.zeros(num_tokens, 8, 16, dtype=spec.dtype)
    fused[:, :4] = batch.query
    query = fused[:, :4]
    out_buffer = torch.full((num_tokens, 4, 32), SENTINEL, dtype=spec.dtype)
    out = out_buffer[:, :, :16]
    result = paged_attention(
        query, *batch.attention_args()[1:], **batch.attention_kwargs(), out=out,
        backend="triton",
    )
    assert result.data_ptr() == out.data_ptr()
    expected = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())
    assert_close_to(out, expected, spec.dtype)
    assert (out_buffer[:, :, 16:] == SENTINEL).all()


def test_poisoned_slots_exist_and_never_leak() -> None:
    spec = BatchSpec(
        query_lens=(3, 1), context_lens=(6, 2), num_q_heads=2, num_kv_heads=1, head_dim=16,
        block_size=4, dtype=torch.float32, extra_blocks_per_seq=2, seed=1,
    )
    batch = make_paged_batch(spec)
    # Sequence 0 uses 9 of its 3 blocks' 12 slots; unused table entries point at a NaN block.
    last_block = int(batch.block_table[0, 2])
    assert torch.isnan(batch.k_cache[last_block, 1:]).all()
    poison_block = int(batch.block_table[0, 3])
    assert torch.isnan(batch.v_cache[poison_block]).all()
    out = paged_attention(*batch.attention_args(), **batch.attention_kwargs(), backend="triton")
    assert torch.isfinite(out).all()


def test_empty_batch_returns_empty_output() -> None:
    spec = BatchSpec(
        query_lens=(), context_lens=(), num_q_heads=2, num_kv_heads=1, head_dim=16,
        block_size=4,
    )
    batch = make_paged_batch(spec)
    out = paged_attention(*batch.attention_args(), **batch.attention_kwargs(), backend="triton")
    assert out.shape == (0, 2, 16)


def test_unused_block_table_entries_are_never_read() -> None:
    """Entries past a sequence's last block may hold anything, even invalid block ids."""
    spec = BatchSpec(
        query_lens=(5, 1), context_lens=(6, 13), num_q_heads=2, num_kv_heads=1, head_dim=16,
        block_size=4, dtype=torch.float32, extra_blocks_per_seq=3, seed=8,
    )
    batch = make_paged_batch(spec)
    expected = paged_attention_reference(*batch.attention_args(), **batch.attention_kwargs())
    table = batch.block_table.clone()
    for seq, seq_len in enumerate(spec.seq_lens):
        table[seq, -(-seq_len // spec.block_size) :] = -(2**30)
    args = list(batch.attention_args())
    args[3] = table
    out = paged_attention(*args, **batch.attention_kwargs(), backend="triton")
    assert_close_to(out, expected, spec.dtype)
