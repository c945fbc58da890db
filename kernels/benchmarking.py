"""Measurement helpers for attention kernels: timing, roofline counts, an SDPA baseline.

Responsibility: the parts of a kernel benchmark that must be right once — median timing with CUDA
events and an L2 flush before every call, device copy bandwidth, the unique bytes and FLOPs of a
paged-attention batch, and ``scaled_dot_product_attention`` over the same K/V (gathered into
contiguous tensors *before* timing) as the baseline. Used by
``bench/gpu_attention.py``; runs on CPU too (``perf_counter``), for smoke checks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.paged_batch import BatchSpec, PagedBatch
from kernels.reference import gather_kv

#: GPU clock cycles (~0.5 ms) of busy-waiting queued before each timed call on CUDA.
HOST_HEADSTART_CYCLES = 1_000_000


class Timer:
    """Median milliseconds of a callable on one device.

    On CUDA each call sits between two CUDA events, after overwriting a buffer larger than L2 so
    no call finds the previous call's data cached, and after a short GPU-side sleep that lets the
    host enqueue the call before the start event fires (so device time, not Python launch
    overhead, is measured — for ours and the baseline alike). On CPU ``perf_counter`` times each
    call.
    """

    def __init__(self, device: str, *, iters: int, warmup: int, flush_bytes: int) -> None:
        self.device = device  # "cuda" or "cpu"
        self.iters = iters  # timed calls per measurement
        self.warmup = warmup  # untimed calls first (compiles, caches)
        self.flush = torch.empty(flush_bytes, dtype=torch.int8, device=device)

    def median_ms(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of ``fn`` over ``iters`` calls after ``warmup`` calls."""
        for _ in range(self.warmup):
            fn()
        if self.device != "cuda":
            times = []
            for _ in range(self.iters):
                self.flush.zero_()
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            return statistics.median(times)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.iters)]
        for start_event, end_event in events:
            self.flush.zero_()
            # Keep the GPU busy while Python validates and launches, so the events time the
            # kernels rather than the host's launch overhead.
            torch.cuda._sleep(HOST_HEADSTART_CYCLES)
            start_event.record()
            fn()
            end_event.record()
        torch.cuda.synchronize()
        return float(statistics.median(s.elapsed_time(e) for s, e in events))


def measure_copy_gbps(timer: Timer, num_bytes: int) -> float:
    """Device copy bandwidth in GB/s of ``dst.copy_(src)``, counting bytes read + written."""
    src = torch.ones(num_bytes // 2, dtype=torch.float16, device=timer.device)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


def attention_flops(spec: BatchSpec) -> float:
    """Causal attention FLOPs: 4 * num_q_heads * head_dim per (query, visible key) pair."""
    pairs = sum(q * c + q * (q + 1) // 2
                for q, c in zip(spec.query_lens, spec.context_lens, strict=True))
    return 4.0 * spec.num_q_heads * spec.head_dim * pairs


def attention_bytes(spec: BatchSpec) -> int:
    """Unique bytes a batch must move: every context's K and V once, query and output rows."""
    elem = torch.empty(0, dtype=spec.dtype).element_size()
    kv_rows = sum(spec.seq_lens) * 2 * spec.num_kv_heads
    q_rows = 2 * sum(spec.query_lens) * spec.num_q_heads
    return (kv_rows + q_rows) * spec.head_dim * elem


def sdpa_baseline(batch: PagedBatch, spec: BatchSpec) -> Callable[[], None]:
    """A callable running SDPA on the batch's K/V, gathered now into contiguous tensors.

    Decodes (query length 1) with equal contexts share one batched call; each longer query gets
    its own call, ``is_causal`` without cached context, else a bottom-right causal mask. GQA goes
    through ``enable_gqa``, so K/V are not repeated per query head.
    """
    starts = batch.query_start_loc.tolist()
    calls: list[Callable[[], object]] = []
    decodes: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
    for seq, seq_len in enumerate(spec.seq_lens):
        begin, end = starts[seq], starts[seq + 1]
        if begin == end:
            continue
        keys = gather_kv(batch.k_cache, batch.block_table[seq], seq_len).transpose(0, 1)
        values = gather_kv(batch.v_cache, batch.block_table[seq], seq_len).transpose(0, 1)
        query = batch.query[begin:end].transpose(0, 1)
        if end - begin == 1:
            decodes.setdefault(seq_len, []).append((query, keys, values))
        else:
            calls.append(_prefill_call(query, keys.contiguous(), values.contiguous(),
                                       spec.context_lens[seq] == 0, batch.scale))
    for group in decodes.values():
        q, k, v = (torch.stack([item[i] for item in group]) for i in range(3))
        calls.append(_decode_call(q, k, v, batch.scale))

    def run() -> None:
        for call in calls:
            call()

    return run


def _decode_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 scale: float) -> Callable[[], object]:
    return lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)


def _prefill_call(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  no_context: bool, scale: float) -> Callable[[], object]:
    q, k, v = query.contiguous()[None], keys[None], values[None]
    if no_context:
        return lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    q_len, kv_len = q.shape[2], k.shape[2]
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device)
    mask = mask.tril(diagonal=kv_len - q_len)
    return lambda: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def speedup(baseline_ms: float, ours_ms: float) -> float:
    """How many times faster ours is than the baseline (nan when either is missing)."""
    if not (baseline_ms > 0 and ours_ms > 0):
        return float("nan")
    return baseline_ms / ours_ms
