"""twinserve's paged-attention kernels: Triton on CUDA, a plain-torch reference everywhere.

Public API (see ``kernels/README.md``):

* ``reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)`` — write new K/V into slots;
* ``paged_attention(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale,
  max_query_len, max_seq_len, out=None, backend=None)`` — varlen causal attention over the cache;
* ``AttentionBackend`` / ``select_backend(device, prefer=None)`` — which implementation runs;
* ``paged_attention_reference`` / ``reshape_and_cache_reference`` — the fp32 torch oracle.

Importing this package never imports Triton: the Triton modules load at the first Triton launch,
which is when Triton fixes whether the kernels are interpreted (``TRITON_INTERPRET=1``).
"""

from kernels.attention import paged_attention, plan_for, reshape_and_cache
from kernels.backend import (
    BACKEND_ENV_VAR,
    AttentionBackend,
    is_triton_interpreter_enabled,
    select_backend,
)
from kernels.reference import (
    Tolerance,
    attention_tolerance,
    paged_attention_reference,
    reshape_and_cache_reference,
)
from kernels.selection import (
    AttentionKernel,
    AttentionPlan,
    TileConfig,
    choose_num_splits,
    plan_attention,
)
from kernels.validation import MAX_HEAD_DIM, SUPPORTED_DTYPES, AttentionDims, CacheDims

__all__ = [
    "BACKEND_ENV_VAR",
    "MAX_HEAD_DIM",
    "SUPPORTED_DTYPES",
    "AttentionBackend",
    "AttentionDims",
    "AttentionKernel",
    "AttentionPlan",
    "CacheDims",
    "TileConfig",
    "Tolerance",
    "attention_tolerance",
    "choose_num_splits",
    "is_triton_interpreter_enabled",
    "paged_attention",
    "paged_attention_reference",
    "plan_attention",
    "plan_for",
    "reshape_and_cache",
    "reshape_and_cache_reference",
    "select_backend",
]
