"""The admission rules both worlds apply before a request reaches the engine core.

* A prompt must be runnable at all (``validate_prompt``: not empty, every token id in the
  vocabulary, no longer than ``max_model_len``) — vLLM's input-processor checks, applied by the
  real engine, the server and the emulated server alike.
* vLLM's API server refuses a request whose prompt plus ``max_tokens`` cannot fit in
  ``max_model_len``; the simulator and the measured run refuse it the same way, with the same
  reason text (it ends up in the requests table's ``rejected_reason`` column).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, overload

from engine.core.errors import UserError

if TYPE_CHECKING:
    import numpy as np


class PromptError(UserError):
    """A prompt the engine cannot run: empty, unknown token ids, or longer than max_model_len."""


def validate_prompt(token_ids: Sequence[int], *, vocab_size: int, max_model_len: int) -> None:
    """Raise PromptError unless the prompt can run (vLLM's input-processor checks)."""
    if not token_ids:
        raise PromptError("the prompt is empty: it must hold at least one token")
    if len(token_ids) > max_model_len:
        raise PromptError(
            f"the prompt (length {len(token_ids)}) is longer than the maximum model length "
            f"of {max_model_len}"
        )
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is out of vocabulary (vocab_size={vocab_size})")


@overload
def exceeds_max_model_len(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> bool:
    ...


@overload
def exceeds_max_model_len(
    num_prompt_tokens: np.ndarray, max_tokens: np.ndarray, max_model_len: int
) -> np.ndarray:
    ...


def exceeds_max_model_len(
    num_prompt_tokens: int | np.ndarray, max_tokens: int | np.ndarray, max_model_len: int
) -> bool | np.ndarray:
    """True when prompt + ``max_tokens`` does not fit in ``max_model_len`` tokens; given two
    integer columns (numpy), the answer for each request (a column of bools)."""
    return num_prompt_tokens + max_tokens > max_model_len


def reject_reason(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> str | None:
    """Why such a request is turned away, or None when it is admitted."""
    if not exceeds_max_model_len(num_prompt_tokens, max_tokens, max_model_len):
        return None
    return (
        f"prompt ({num_prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len "
        f"({max_model_len})"
    )
