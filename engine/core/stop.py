"""When does a request stop? vLLM 0.33.0's ``check_stop``, in its exact order.

After each appended token: EOS → stopped; a stop token id → stopped (``stop_reason`` = token);
``num_tokens >= max_model_len`` or ``num_output_tokens >= max_tokens`` → length-capped; below
``min_tokens`` → never stopped by what follows (repetition detection, not implemented).

Note the order: EOS and stop tokens are checked *before* ``min_tokens``, as 0.33.0 does. A real
sampler masks EOS and stop tokens until ``min_tokens`` outputs exist (our sampler does), so the
order only matters for scripted outputs such as the golden replays.
"""

from __future__ import annotations

from engine.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the request's finished status and return True if its last token ends it."""
    last = request.output_token_ids[-1]
    if last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in request.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    if request.num_tokens >= max_model_len or len(request.output_token_ids) >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
