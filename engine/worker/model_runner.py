"""One engine step on the model: schedule → flattened varlen batch → forward → sampled tokens.

Responsibility (vLLM V1's GPU model runner, without CUDA graphs or spec decode): keep the
per-request worker state in step with the scheduler (``RequestStates``), flatten the step's
scheduled tokens into one batch, run the model over the paged KV cache, and sample one token
for every request whose prefill is complete (``partial_prefill_req_ids`` sample nothing).

Batch layout, in ``num_scheduled_tokens`` order (running requests, then new/resumed ones):
request ``i`` contributes tokens ``[c_i, c_i + n_i)`` of its token ids, where ``c_i`` is its
``num_computed_tokens`` before the step (prefix hits and earlier chunks are already cached) and
``n_i`` its scheduled count. ``positions`` are those absolute indices; ``slot_mapping`` maps each
to ``block_ids[pos // block_size] * block_size + pos % block_size``; ``seq_lens = c_i + n_i``;
``query_start_loc`` is the running sum of ``n_i``; a sampling request's logits row is the last
row of its query. Metadata is built on the host and copied to the device once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.core.outputs import SchedulerOutput
from engine.worker.attention import AttentionMetadata
from engine.worker.model import KVCache, LlamaModel
from engine.worker.request_state import RequestStates
from engine.worker.sampler import RowSampling, Sampler


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """The flattened batch of one step, on the model's device."""

    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]: absolute position of each token
    attn: AttentionMetadata  # per-sequence layout shared by every layer
    logits_indices: torch.Tensor  # int64 [num_sampling]: rows whose hidden state is sampled
    sampling_req_ids: list[str]  # request of each logits row, in order


def build_attention_metadata(
    block_tables: Sequence[Sequence[int]],
    num_computed: Sequence[int],
    query_lens: Sequence[int],
    block_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, AttentionMetadata]:
    """``(positions, metadata)`` for sequences that add ``query_lens`` tokens after
    ``num_computed`` cached ones, with the given block tables (host lists)."""
    num_seqs = len(query_lens)
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    starts = torch.tensor(num_computed, dtype=torch.int64)
    seq_lens = starts + q_lens
    query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int64)
    torch.cumsum(q_lens, dim=0, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_index = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
    positions = torch.arange(num_tokens) - query_start_loc[:-1][seq_index] + starts[seq_index]
    blocks_used = [-(-int(s) // block_size) for s in seq_lens.tolist()]
    width = max(blocks_used, default=1) or 1
    rows = []
    for table, used in zip(block_tables, blocks_used, strict=True):
        if len(table) < used:
            raise RuntimeError(f"a block table of {len(table)} blocks cannot hold {used} blocks")
        rows.append(list(table[:used]) + [0] * (width - used))
    block_table = torch.tensor(rows, dtype=torch.int32).reshape(num_seqs, width)
    slots = block_table[seq_index, positions // block_size].long() * block_size + (
        positions % block_size
    )
    meta = AttentionMetadata(
        slot_mapping=slots.to(device),
        block_table=block_table.to(device),
        seq_lens=seq_lens.to(torch.int32).to(device),
        query_start_loc=query_start_loc.to(torch.int32).to(device),
        max_query_len=max(query_lens, default=0),
        max_seq_len=int(seq_lens.max()) if num_seqs else 0,
    )
    return positions.to(device), meta


class ModelRunner:
    """Executes ``SchedulerOutput``s in order on one model, KV cache and sampler."""

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[KVCache],
        block_size: int,
        sampler: Sampler,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.sampler = sampler
        self.device = model.device
        self.states = RequestStates(model.device)

    @torch.inference_mode()
    def execute(self, sched_out: SchedulerOutput) -> dict[str, list[int]]:
        """Run one step (this rank's stage of it); returns ``{req_id: [token]}`` for every
        request that sampled — on the last pipeline stage, whose TP ranks all sample the same
        tokens from the same gathered logits. Earlier stages receive the previous stage's
        hidden states, send theirs on and sample nothing: the scheduler sends them a request's
        tokens (``all_token_ids``) before it runs again, as vLLM's does under PP."""
        self.states.apply(sched_out)
        if sched_out.total_num_scheduled_tokens == 0:
            return {}
        inputs = self.prepare_inputs(sched_out)
        model = self.model
        hidden_in = None
        if not model.is_first_stage:
            shape = (sched_out.total_num_scheduled_tokens, model.config.hidden_size)
            hidden_in = model.ctx.recv_from_previous_stage(shape, model.dtype, self.device)
        hidden = model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn,
                       hidden_in)
        if not model.is_last_stage:
            model.ctx.send_to_next_stage(hidden)
            return {}
        if not inputs.sampling_req_ids:
            return {}
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        rows = [self.states[r].row_sampling() for r in inputs.sampling_req_ids]
        tokens = self.sampler(logits, rows).tolist()
        sampled: dict[str, list[int]] = {}
        for req_id, token in zip(inputs.sampling_req_ids, tokens, strict=True):
            self.states.append_token(req_id, token)
            sampled[req_id] = [token]
        return sampled

    def prepare_inputs(self, sched_out: SchedulerOutput) -> ModelInputs:
        """Flatten the step's scheduled tokens (see the module docstring for the layout)."""
        partial = sched_out.partial_prefill_req_ids
        input_ids: list[int] = []
        tables: list[list[int]] = []
        computed: list[int] = []
        q_lens: list[int] = []
        logits_rows: list[int] = []
        sampling: list[str] = []
        for req_id, n in sched_out.num_scheduled_tokens.items():
            state = self.states[req_id]
            start = state.num_computed_tokens
            input_ids.extend(state.token_ids[start : start + n])
            tables.append(state.block_ids)
            computed.append(start)
            q_lens.append(n)
            if req_id not in partial:
                logits_rows.append(len(input_ids) - 1)
                sampling.append(req_id)
        positions, attn = build_attention_metadata(
            tables, computed, q_lens, self.block_size, self.device
        )
        return ModelInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64).to(self.device),
            positions=positions,
            attn=attn,
            logits_indices=torch.tensor(logits_rows, dtype=torch.int64).to(self.device),
            sampling_req_ids=sampling,
        )

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, num_seqs: int, kv_caches: list[KVCache]) -> None:
        """A dummy forward + sampling at the given size (memory profiling and warm-up).

        ``kv_caches`` may be tiny: every slot is -1 (nothing written) and every block table
        entry is block 0, so the forward reads only block 0.
        """
        num_seqs = max(1, min(num_seqs, num_tokens))
        base, extra = divmod(num_tokens, num_seqs)
        q_lens = [base + (1 if i < extra else 0) for i in range(num_seqs)]
        width = -(-max(q_lens) // self.block_size)
        positions, attn = build_attention_metadata(
            [[0] * width] * num_seqs, [0] * num_seqs, q_lens, self.block_size, self.device
        )
        attn = AttentionMetadata(
            slot_mapping=torch.full_like(attn.slot_mapping, -1),
            block_table=attn.block_table,
            seq_lens=attn.seq_lens,
            query_start_loc=attn.query_start_loc,
            max_query_len=attn.max_query_len,
            max_seq_len=attn.max_seq_len,
        )
        input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        model = self.model
        hidden_in = None
        if not model.is_first_stage:  # a stand-in for the previous stage's output
            hidden_in = torch.zeros(num_tokens, model.config.hidden_size, dtype=model.dtype,
                                    device=self.device)
        hidden = model(input_ids, positions, kv_caches, attn, hidden_in)
        if not model.is_last_stage:
            return
        last_rows = attn.query_start_loc[1:].long() - 1
        logits = self.model.compute_logits(hidden[last_rows])
        rows = [RowSampling(temperature=1.0, top_k=50, top_p=0.9, generator=None)] * num_seqs
        self.sampler(logits, rows)
