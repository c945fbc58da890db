"""Launchers reject bad arguments with a ValueError that names the argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kernels import MAX_HEAD_DIM, paged_attention, reshape_and_cache
from kernels.paged_batch import BatchSpec, PagedBatch, make_paged_batch

Mutation = Callable[[dict[str, Any]], None]


def _batch() -> PagedBatch:
    spec = BatchSpec(
        query_lens=(3, 1), context_lens=(4, 6), num_q_heads=4, num_kv_heads=2, head_dim=16,
        block_size=4, dtype=torch.float16,
    )
    return make_paged_batch(spec)


def _call_args(batch: PagedBatch) -> dict[str, Any]:
    names = ("query", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc")
    return dict(zip(names, batch.attention_args(), strict=True)) | batch.attention_kwargs()


def _strided_last_dim(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, but the last dimension is not contiguous."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _set(name: str, make: Callable[[dict[str, Any]], Any]) -> Mutation:
    def mutate(args: dict[str, Any]) -> None:
        args[name] = make(args)

    return mutate


ATTENTION_CASES: list[tuple[str, Mutation, str]] = [
    ("query-2d", _set("query", lambda a: a["query"][:, 0]), "query must have 3 dimensions"),
    ("query-int", _set("query", lambda a: a["query"].to(torch.int32)), "query has dtype"),
    ("query-fp64", _set("query", lambda a: a["query"].double()), "query has dtype"),
    ("query-strided-dim", _set("query", lambda a: _strided_last_dim(a["query"])),
     "query must have a contiguous last dimension"),
    ("dtype-mismatch", _set("query", lambda a: a["query"].float()),
     "k_cache dtype torch.float16 must match query dtype torch.float32"),
    ("cache-shapes", _set("v_cache", lambda a: a["v_cache"][:, :2]),
     "k_cache and v_cache must have the same shape"),
    ("cache-dtypes", _set("v_cache", lambda a: a["v_cache"].bfloat16()),
     "differ in dtype"),
    ("cache-strided", _set("k_cache", lambda a: _strided_last_dim(a["k_cache"])),
     "k_cache must have a contiguous last dimension"),
    ("head-dim-mismatch", _set("query", lambda a: a["query"][..., :8]),
     "query head_dim 8 does not match the cache head_dim 16"),
    ("gqa-ratio", _set("query", lambda a: a["query"][:, :3]),
     r"num_q_heads \(3\) must be a multiple of num_kv_heads \(2\)"),
    ("block-table-int64", _set("block_table", lambda a: a["block_table"].long()),
     "block_table must have dtype torch.int32"),
    ("block-table-rows", _set("block_table", lambda a: a["block_table"][:1]),
     "block_table has 1 rows but seq_lens has 2 entries"),
    ("block-table-strided", _set("block_table", lambda a: a["block_table"].t().contiguous().t()),
     "block_table must have a contiguous last dimension"),
    ("seq-lens-2d", _set("seq_lens", lambda a: a["seq_lens"][None]),
     "seq_lens must have 1 dimensions"),
    ("qsl-length", _set("query_start_loc", lambda a: a["query_start_loc"][:2]),
     "query_start_loc must have num_seqs \\+ 1 = 3 entries"),
    ("device", _set("block_table", lambda a: a["block_table"].to("meta")),
     "block_table is on meta"),
    ("scale-negative", _set("scale", lambda a: -1.0), "scale must be finite and > 0"),
    ("scale-tensor", _set("scale", lambda a: torch.tensor(0.5)), "scale must be a Python float"),
    ("max-query-tensor", _set("max_query_len", lambda a: torch.tensor(3)),
     "max_query_len must be a host-side Python int"),
    ("max-query-zero", _set("max_query_len", lambda a: 0), "max_query_len must be between 1"),
    ("max-query-too-big", _set("max_query_len", lambda a: 99), "max_query_len must be between"),
    ("max-seq-below-query", _set("max_seq_len", lambda a: 2),
     r"max_seq_len \(2\) must be >= max_query_len \(3\)"),
    ("max-seq-capacity", _set("max_seq_len", lambda a: 10_000), "exceeds what block_table can"),
    ("out-dtype", _set("out", lambda a: torch.empty_like(a["query"], dtype=torch.float32)),
     "out dtype torch.float32 must equal query dtype"),
    ("out-shape", _set("out", lambda a: a["query"][:1].clone()), "out shape"),
]


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize(
    ("mutate", "message"), [c[1:] for c in ATTENTION_CASES], ids=[c[0] for c in ATTENTION_CASES]
)
def test_attention_argument_errors(backend: str, mutate: Mutation, message: str) -> None:
    args = _call_args(_batch())
    mutate(args)
    with pytest.raises(ValueError, match=message):
        paged_attention(**args, backend=backend)


def test_head_dim_above_the_limit_is_rejected() -> None:
    spec = BatchSpec(
        query_lens=(1,), context_lens=(0,), num_q_heads=1, num_kv_heads=1,
        head_dim=MAX_HEAD_DIM + 8, block_size=4,
    )
    batch = make_paged_batch(spec)
    with pytest.raises(ValueError, match=f"head_dim {MAX_HEAD_DIM + 8} is not supported"):
        paged_attention(*batch.attention_args(), **batch.attention_kwargs(), backend="triton")


VALUE_CASES: list[tuple[str, Mutation, str]] = [
    ("qsl-start", _set("query_start_loc", lambda a: a["query_start_loc"] + 1),
     "query_start_loc must start at 0"),
    ("query-longer-than-seq", _set("seq_lens", lambda a: torch.tensor([2, 7], dtype=torch.int32)),
     r"query length 3 exceeds seq_lens\[0\] = 2"),
    ("seq-above-bound", _set("max_seq_len", lambda a: 6), r"seq_lens\[0\] = 7 exceeds max_seq_len"),
    ("block-id", _set("block_table", lambda a: a["block_table"] + 100), "outside the cache's"),
    ("decreasing-qsl",
     _set("query_start_loc", lambda a: torch.tensor([0, 3, 2], dtype=torch.int32)),
     "query_start_loc decreases at sequence 1"),
]


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize(
    ("mutate", "message"), [c[1:] for c in VALUE_CASES], ids=[c[0] for c in VALUE_CASES]
)
def test_metadata_value_errors_on_cpu(backend: str, mutate: Mutation, message: str) -> None:
    args = _call_args(_batch())
    mutate(args)
    with pytest.raises(ValueError, match=message):
        paged_attention(**args, backend=backend)


def test_cache_argument_errors() -> None:
    key = torch.ones(2, 1, 8)
    cache = torch.zeros(2, 4, 1, 8)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"slot_mapping must have dtype torch\.int64"):
        reshape_and_cache(key, key, cache, cache, slots.int(), backend="triton")
    with pytest.raises(ValueError, match="slot_mapping has 1 entries but key has 2 tokens"):
        reshape_and_cache(key, key, cache, cache, slots[:1], backend="triton")
    with pytest.raises(ValueError, match="key has 2 heads x 8 dims"):
        reshape_and_cache(key.expand(2, 2, 8), key.expand(2, 2, 8), cache, cache, slots,
                          backend="triton")
    with pytest.raises(ValueError, match=r"value dtype torch\.float16 must match cache dtype"):
        reshape_and_cache(key, key.half(), cache, cache, slots, backend="triton")
    with pytest.raises(ValueError, match="key and value must have the same shape"):
        reshape_and_cache(key, key[:1], cache, cache, slots, backend="triton")
