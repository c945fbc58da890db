"""The admission rule both worlds apply before a request reaches the engine core.

vLLM's API server refuses a request whose prompt plus ``max_tokens`` cannot fit in
``max_model_len``; the simulator and the measured run refuse it the same way, with the same
reason text (it ends up in the requests table's ``rejected_reason`` column).
"""

from __future__ import annotations


def exceeds_max_model_len(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> bool:
    """True when prompt + ``max_tokens`` does not fit in ``max_model_len`` tokens."""
    return num_prompt_tokens + max_tokens > max_model_len


def reject_reason(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> str | None:
    """Why such a request is turned away, or None when it is admitted."""
    if not exceeds_max_model_len(num_prompt_tokens, max_tokens, max_model_len):
        return None
    return (
        f"prompt ({num_prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len "
        f"({max_model_len})"
    )
