"""Backend selection and the kernel-selection rule."""

from __future__ import annotations

import pytest
import torch

from kernels import (
    BACKEND_ENV_VAR,
    AttentionBackend,
    AttentionKernel,
    AttentionPlan,
    choose_num_splits,
    paged_attention,
    plan_attention,
    select_backend,
)
from kernels.paged_batch import BatchSpec, make_paged_batch
from kernels.selection import (
    MAX_SPLITS,
    TileConfig,
    decode_tile_config,
    unified_tile_config,
)


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)


def test_auto_picks_triton_on_cuda_and_reference_elsewhere() -> None:
    assert select_backend(torch.device("cuda", 0)) is AttentionBackend.TRITON
    assert select_backend("cpu") is AttentionBackend.REFERENCE
    assert select_backend("cpu", prefer="auto") is AttentionBackend.REFERENCE


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    assert select_backend("cpu", prefer="triton") is AttentionBackend.TRITON
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        select_backend("cpu", prefer="triton")
    assert select_backend("cpu", prefer=AttentionBackend.REFERENCE) is AttentionBackend.REFERENCE


def test_triton_on_other_devices_is_an_error() -> None:
    with pytest.raises(ValueError, match="not on mps"):
        select_backend("mps", prefer="triton")


def test_environment_variable_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV_VAR, "triton")
    assert select_backend("cpu") is AttentionBackend.TRITON
    monkeypatch.setenv(BACKEND_ENV_VAR, "reference")
    assert select_backend("cuda") is AttentionBackend.REFERENCE
    assert select_backend("cuda", prefer="triton") is AttentionBackend.TRITON
    monkeypatch.setenv(BACKEND_ENV_VAR, "cudnn")
    with pytest.raises(ValueError, match=f"{BACKEND_ENV_VAR}='cudnn' is not an attention"):
        select_backend("cpu")


def test_unknown_preference_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'triton', 'reference'"):
        select_backend("cpu", prefer="flash")


def test_default_backend_on_cpu_is_the_reference_and_agrees_with_triton() -> None:
    spec = BatchSpec(
        query_lens=(4, 1), context_lens=(3, 9), num_q_heads=2, num_kv_heads=1, head_dim=16,
        block_size=4, dtype=torch.float32, seed=4,
    )
    batch = make_paged_batch(spec)
    by_default = paged_attention(*batch.attention_args(), **batch.attention_kwargs())
    by_triton = paged_attention(
        *batch.attention_args(), **batch.attention_kwargs(), backend="triton"
    )
    torch.testing.assert_close(by_triton, by_default, atol=1e-5, rtol=1e-5)


def test_kernels_in_this_directory_are_interpreted() -> None:
    from kernels.triton_common import is_interpreted
    from kernels.triton_unified import _unified_attention_kernel

    assert is_interpreted(_unified_attention_kernel)


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "max_seq_len", "num_sms", "expected"),
    [
        (256, 8, 32768, 132, 1),  # 2048 programs fill the GPU: no split
        (32, 8, 4096, 132, 3),  # 256 programs, 528 wanted
        (1, 8, 32768, 132, MAX_SPLITS),  # one long sequence: as many splits as allowed
        (1, 8, 1024, 132, 2),  # ...but each split streams >= 512 tokens
        (4, 8, 511, 132, 1),  # short contexts never split
        (0, 8, 4096, 132, 1),  # empty batch
    ],
)
def test_split_rule(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, expected: int
) -> None:
    splits = choose_num_splits(
        num_seqs=num_seqs, num_kv_heads=num_kv_heads, max_seq_len=max_seq_len, num_sms=num_sms
    )
    assert splits == expected


def test_plan_picks_unified_for_any_prefill_token() -> None:
    plan = plan_attention(
        num_seqs=1, num_kv_heads=8, max_query_len=2, max_seq_len=32768, num_sms=132
    )
    assert plan == AttentionPlan(AttentionKernel.UNIFIED, 1)
    plan = plan_attention(
        num_seqs=1, num_kv_heads=8, max_query_len=1, max_seq_len=32768, num_sms=132
    )
    assert plan == AttentionPlan(AttentionKernel.DECODE, MAX_SPLITS)


def test_tile_configs_hold_a_gqa_group_and_respect_dot_minimums() -> None:
    def unified(q_per_kv: int, max_q: int, mean_q: int, head_dim: int = 128) -> TileConfig:
        return unified_tile_config(num_queries_per_kv=q_per_kv, max_query_len=max_q,
                                   mean_query_len=mean_q, head_dim=head_dim)

    assert unified(4, 1, 1).block_m == 16  # decode-only
    assert unified(4, 2048, 17).block_m == 64  # one prefill among many decodes
    assert unified(4, 4096, 4096) == TileConfig(block_m=128, tile_size=64, num_warps=8,
                                                num_stages=2)
    assert unified(4, 4096, 4096, head_dim=256).block_m == 64
    assert unified(32, 1, 1, head_dim=64).block_m == 32  # the whole GQA group in one tile
    assert unified(3, 5, 5).block_m == 16
    assert decode_tile_config(num_queries_per_kv=3, head_dim=80).block_m == 16
    assert decode_tile_config(num_queries_per_kv=4, head_dim=256).tile_size == 32
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16"):
        TileConfig(block_m=8, tile_size=16, num_warps=4, num_stages=2)
