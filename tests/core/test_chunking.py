"""The chunk rule of ``engine/core/chunking.py``, stated as vLLM V1's scheduler applies it.

Running request: ``min(needed, threshold if 0 < threshold, budget left, max_model_len − 1 −
computed)``. Admission: ``min(needed, threshold if 0 < threshold)``, cut to the budget only with
chunked prefill (else 0: it waits). The threshold is in force only with more than one request
running or waiting. The scheduler skips the call for a decode (one token) below max_model_len;
the last property checks that shortcut gives what the call would.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.chunking import (
    admission_chunk,
    effective_long_prefill_threshold,
    running_chunk,
)

tokens = st.integers(min_value=1, max_value=10_000)
thresholds = st.integers(min_value=0, max_value=10_000)


@pytest.mark.parametrize(("threshold", "num_unfinished", "expected"), [
    (256, 0, 0), (256, 1, 0), (256, 2, 256), (256, 100, 256), (0, 5, 0),
])
def test_threshold_applies_only_with_company(
    threshold: int, num_unfinished: int, expected: int
) -> None:
    assert effective_long_prefill_threshold(threshold, num_unfinished) == expected


@given(needed=tokens, threshold=thresholds, budget=tokens,
       computed=st.integers(min_value=0, max_value=20_000),
       max_model_len=st.integers(min_value=1, max_value=20_000))
def test_running_chunk_is_the_smallest_cap(
    needed: int, threshold: int, budget: int, computed: int, max_model_len: int
) -> None:
    caps = [needed, budget, max_model_len - 1 - computed]
    if threshold > 0:
        caps.append(threshold)
    assert running_chunk(needed, threshold, budget, computed, max_model_len) == min(caps)


@given(needed=tokens, threshold=thresholds, budget=tokens, chunked=st.booleans())
def test_admission_chunk_cuts_to_the_budget_only_with_chunked_prefill(
    needed: int, threshold: int, budget: int, chunked: bool
) -> None:
    wanted = min(needed, threshold) if threshold > 0 else needed
    expected = wanted if wanted <= budget else budget if chunked else 0
    assert admission_chunk(needed, threshold, budget, chunked) == expected


@given(threshold=thresholds, budget=tokens, max_model_len=st.integers(2, 20_000),
       computed=st.integers(0, 20_000))
def test_a_decode_needs_no_cap_below_max_model_len(
    threshold: int, budget: int, max_model_len: int, computed: int
) -> None:
    expected = 1 if computed < max_model_len - 1 else max_model_len - 1 - computed
    assert running_chunk(1, threshold, budget, computed, max_model_len) == expected
