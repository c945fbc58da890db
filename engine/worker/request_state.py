"""The worker's per-request state across steps (vLLM's ``CachedRequestState`` + persistent batch).

Responsibility: mirror, from nothing but the stream of ``SchedulerOutput``s, what the worker must
know about every live request — its token ids, its block table, how many tokens are already in
the KV cache, its sampling parameters and generator — and keep it consistent with the core:

* ``finished_req_ids`` → the state is dropped (ids the worker never saw are ignored);
* ``scheduled_new_reqs`` → a state is created from the full prompt and the whole block table;
* ``scheduled_cached_reqs`` → running requests append ``new_block_ids``; *resumed* ones restart
  their block table from ``new_block_ids``; ``num_computed_tokens`` is taken from the core;
  ``all_token_ids`` (sent for requests not scheduled in the previous step) replaces the token list;
* ``preempted_req_ids`` → nothing to do: the state (tokens, generator) is kept until the request
  resumes with a fresh block table or finishes.

The worker appends its *own* sampled tokens at execution time (``append_token``), so under async
scheduling the tokens of step N are in place when step N+1 — scheduled before step N's output
reached the core — executes. Invariant checked every step: a request's known tokens cover
``num_computed_tokens + num_scheduled_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.outputs import SchedulerOutput
from engine.core.request import SamplingParams
from engine.worker.sampler import RowSampling


@dataclass(slots=True)
class RequestState:
    """What the worker knows about one live request."""

    req_id: str
    token_ids: list[int]  # prompt + outputs, incl. samples the core has not applied yet
    num_prompt_tokens: int  # leading prompt tokens of token_ids
    sampling_params: SamplingParams  # temperature, top-k/p, min_tokens, seed, stop ids
    eos_token_id: int | None  # None when ignore_eos
    block_ids: list[int]  # block table (block 0 is the null block, never listed)
    num_computed_tokens: int  # tokens in the KV cache before the current step
    generator: torch.Generator | None  # the request's own generator (seeded requests)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def row_sampling(self) -> RowSampling:
        """This step's sampling row: EOS/stop ids are banned until ``min_tokens`` outputs."""
        params = self.sampling_params
        banned: tuple[int, ...] = ()
        if self.num_output_tokens < params.min_tokens:
            eos = () if self.eos_token_id is None else (self.eos_token_id,)
            banned = eos + tuple(params.stop_token_ids)
        return RowSampling(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            generator=self.generator,
            banned_token_ids=banned,
        )


class RequestStates:
    """All live requests of one worker, updated from each ``SchedulerOutput`` in order."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.states: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, req_id: str) -> RequestState:
        try:
            return self.states[req_id]
        except KeyError:
            raise RuntimeError(
                f"the scheduler scheduled request {req_id!r}, which this worker does not know "
                "(SchedulerOutputs must reach the worker in order, none skipped)"
            ) from None

    def apply(self, out: SchedulerOutput) -> None:
        """Bring every state up to date with one step's schedule (before it executes)."""
        for req_id in out.finished_req_ids:
            self.states.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            if new.prompt_token_ids is None:
                raise ValueError(
                    f"request {new.req_id!r} carries no prompt token ids: a real worker cannot "
                    "run length-only (simulated) requests"
                )
            seed = new.sampling_params.seed
            generator = None
            if seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(seed)
            self.states[new.req_id] = RequestState(
                req_id=new.req_id,
                token_ids=list(new.prompt_token_ids),
                num_prompt_tokens=new.num_prompt_tokens,
                sampling_params=new.sampling_params,
                eos_token_id=new.eos_token_id,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                generator=generator,
            )
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self[req_id]
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                state.block_ids = list(new_blocks or ())
            elif new_blocks:
                state.block_ids.extend(new_blocks)
            state.num_computed_tokens = cached.num_computed_tokens[i]
            all_ids = cached.all_token_ids.get(req_id)
            if all_ids is not None:
                state.token_ids = list(all_ids)
        for req_id, n in out.num_scheduled_tokens.items():
            state = self[req_id]
            if len(state.token_ids) < state.num_computed_tokens + n:
                raise RuntimeError(
                    f"request {req_id!r}: scheduled tokens up to position "
                    f"{state.num_computed_tokens + n} but the worker knows only "
                    f"{len(state.token_ids)} tokens"
                )

    def append_token(self, req_id: str, token_id: int) -> None:
        self.states[req_id].token_ids.append(token_id)
