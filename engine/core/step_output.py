"""What one ``schedule()`` call builds: its scratch plan, the worker payload, the batch shape.

Split from ``scheduler.py`` so the scheduler reads as its decisions; these functions only
package them. ``advance_scheduled`` is vLLM's ``_update_after_schedule``: it advances
``num_computed_tokens`` *before* the step executes (so an unfinished prefill can be scheduled
again at once — what lets async scheduling overlap), marks partial prefills, and adds the async
output placeholder for every request that will sample.
"""

from __future__ import annotations

from engine.core.outputs import (
    AdmissionBlocker,
    BatchShape,
    CachedRequestData,
    NewRequestData,
)
from engine.core.request import Request


class StepPlan:
    """Mutable scratch state of one ``schedule()`` call."""

    __slots__ = (
        "blocker",
        "new_block_ids",
        "num_scheduled_tokens",
        "preempted",
        "scheduled_new",
        "scheduled_resumed",
        "scheduled_running",
        "token_budget",
    )

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget
        self.num_scheduled_tokens: dict[str, int] = {}
        self.new_block_ids: dict[str, list[int]] = {}
        self.scheduled_running: list[Request] = []
        self.scheduled_new: list[Request] = []
        self.scheduled_resumed: list[Request] = []
        self.preempted: list[Request] = []
        self.blocker = AdmissionBlocker.NONE


def new_request_data(request: Request, block_ids: list[int]) -> NewRequestData:
    """A first admission as the worker receives it (the whole block table)."""
    return NewRequestData(
        req_id=request.req_id,
        prompt_token_ids=request.prompt_token_ids,
        num_prompt_tokens=request.num_prompt_tokens,
        sampling_params=request.sampling_params,
        eos_token_id=request.eos_token_id,
        block_ids=block_ids,
        num_computed_tokens=request.num_computed_tokens,
    )


def cached_request_data(plan: StepPlan, prev: set[str]) -> CachedRequestData:
    """Running then resumed requests; full token ids for those the worker did not see in
    the previous step (``prev``)."""
    blocks = plan.new_block_ids
    resumed = {r.req_id for r in plan.scheduled_resumed}
    ids: list[str] = []
    new_block_ids: list[list[int] | None] = []
    num_computed: list[int] = []
    num_output: list[int] = []
    all_token_ids: dict[str, list[int]] = {}
    for reqs in (plan.scheduled_running, plan.scheduled_resumed):
        for r in reqs:  # one pass per request: every step visits every running request
            req_id = r.req_id
            ids.append(req_id)
            new_block_ids.append(blocks[req_id] or None)
            num_computed.append(r.num_computed_tokens)
            num_output.append(r.num_output_tokens + r.num_output_placeholders)
            if (req_id not in prev or req_id in resumed) and r.has_token_ids:
                all_token_ids[req_id] = list(r.all_token_ids)
    return CachedRequestData(
        req_ids=ids,
        resumed_req_ids=resumed,
        new_block_ids=new_block_ids,
        num_computed_tokens=num_computed,
        num_output_tokens=num_output,
        all_token_ids=all_token_ids,
    )


def advance_scheduled(
    requests: dict[str, Request], num_scheduled: dict[str, int], async_sched: bool
) -> tuple[BatchShape, set[str]]:
    """Advance counters of scheduled requests (before execution, as vLLM's
    ``_update_after_schedule``) and measure the step's batch shape; returns the shape and
    the requests still mid-prefill."""
    partial: set[str] = set()
    prefill_q: list[int] = []
    prefill_ctx: list[int] = []
    num_tokens = dec_n = dec_sum = dec_max = 0
    for req_id, n in num_scheduled.items():
        request = requests[req_id]
        ctx = request.num_computed_tokens
        num_tokens += n
        if n == 1:
            dec_n += 1
            dec_sum += ctx
            if ctx > dec_max:
                dec_max = ctx
        else:
            prefill_q.append(n)
            prefill_ctx.append(ctx)
        ctx += n
        request.num_computed_tokens = ctx
        request.num_in_flight_tokens += n
        if ctx < request.num_tokens + request.num_output_placeholders:
            request.is_prefill_chunk = True
            partial.add(req_id)
        else:
            request.is_prefill_chunk = False
            if async_sched:
                request.num_output_placeholders += 1
    shape = BatchShape(
        num_reqs=len(num_scheduled),
        num_tokens=num_tokens,
        prefill_query_lens=tuple(prefill_q),
        prefill_context_lens=tuple(prefill_ctx),
        num_decode_reqs=dec_n,
        decode_context_sum=dec_sum,
        decode_context_max=dec_max,
        num_sampling_reqs=len(num_scheduled) - len(partial),
    )
    return shape, partial
