"""How many tokens a request computes in one step: the chunk rule, in one place.

``schedule()`` gives each request the tokens it still needs, capped three ways (vLLM V1's
``_schedule_running`` / ``_schedule_waiting``): by the long-prefill threshold, which applies
only while more than one request is running or waiting; by the step's remaining token budget;
and, for a running request, by ``max_model_len − 1`` computed tokens. An admission that does
not fit the budget is cut to it only with chunked prefill; without, the admission loop stops.

The scheduler (``scheduler.py``) and the bulk path (``bulk/``), which predicts what
``schedule()`` will do, both call these functions, so the rule is written once. Pure functions
of plain ints: no state, no clock.
"""

from __future__ import annotations


def effective_long_prefill_threshold(
    long_prefill_token_threshold: int, num_unfinished_requests: int
) -> int:
    """The threshold in force (0: none): it caps prefills only while more than one request is
    running or waiting."""
    return long_prefill_token_threshold if num_unfinished_requests > 1 else 0


def running_chunk(
    num_new_tokens: int,
    threshold: int,
    token_budget: int,
    num_computed_tokens: int,
    max_model_len: int,
) -> int:
    """Tokens a RUNNING request computes: ``num_new_tokens`` capped by the threshold (in
    force, 0: none), the budget left, and ``max_model_len − 1`` computed tokens (≤ 0: none)."""
    if 0 < threshold < num_new_tokens:
        num_new_tokens = threshold
    if num_new_tokens > token_budget:
        num_new_tokens = token_budget
    room = max_model_len - 1 - num_computed_tokens
    if num_new_tokens > room:
        num_new_tokens = room
    return num_new_tokens


def admission_chunk(
    num_new_tokens: int, threshold: int, token_budget: int, enable_chunked_prefill: bool
) -> int:
    """Tokens an admitted WAITING request computes (``num_new_tokens`` ≥ 1: a prefix hit never
    covers the last token): capped by the threshold in force, then cut to the budget left —
    only with chunked prefill; without, 0: it does not fit this step."""
    if 0 < threshold < num_new_tokens:
        num_new_tokens = threshold
    if num_new_tokens > token_budget:
        return token_budget if enable_chunked_prefill else 0
    return num_new_tokens
