"""Benchmark twinserve's Triton paged attention on one GPU against the copy roofline and SDPA.

Run on an H200 (torch 2.11, triton 3.6, Python 3.12, no network, no twinserve install)::

    python -m bench.gpu_attention [--out results.json] [--budget-s 240]

or anywhere, in seconds, on tiny shapes with the Triton interpreter on the CPU::

    python -m bench.gpu_attention --smoke

Steps, printed as they finish: (1) device copy bandwidth (read + write bytes); (2) a correctness
gate — random mixed and decode batches in bf16/fp16/fp32, forced split counts and the unified
kernel on a decode batch, against the fp32 torch reference within KERNELS.md's tolerances; (3) the
main cases: decode on Llama-3.1-8B shapes (32 query heads, 8 KV heads, head_dim 128, bf16, block
size 16, one layer) over batch 1-256 x context 512-32k, and mixed prefill + decode batches, each
timed for ``paged_attention`` and for ``scaled_dot_product_attention`` on the same K/V gathered
into contiguous tensors beforehand; (4) tuning sweeps — split counts on a few decode cases, tile
configs of both kernels — to retune ``kernels/selection.py``; (5) the main table, printed last:
time, unique bytes moved, GB/s, % of copy bandwidth, TFLOP/s, ours vs SDPA. Timing: CUDA events
around each call, L2 flushed (256 MiB overwritten) before every call, median of ``iters`` calls.
No case starts after ``--budget-s`` seconds, so the run ends within about five minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# Importing ``kernels`` does not import its Triton modules (they load at the first launch), so
# ``--smoke`` can still switch the interpreter on in ``main``.
from kernels import (
    attention_tolerance,
    paged_attention,
    paged_attention_reference,
    plan_for,
)
from kernels.benchmarking import (
    Timer,
    attention_bytes,
    attention_flops,
    measure_copy_gbps,
    sdpa_baseline,
    speedup,
)
from kernels.paged_batch import BatchSpec, PagedBatch, make_paged_batch
from kernels.selection import TileConfig
from kernels.validation import validate_attention_inputs

SEED = 0
Case = tuple[str, tuple[int, ...], tuple[int, ...]]  # (name, query_lens, context_lens)


def _case(name: str, prefill: Sequence[tuple[int, int]], decodes: int = 0, ctx: int = 0) -> Case:
    """A named batch of ``(query_len, context_len)`` prefill chunks plus equal-context decodes."""
    return (name, tuple(q for q, _ in prefill) + (1,) * decodes,
            tuple(c for _, c in prefill) + (ctx - 1,) * decodes)


@dataclass(frozen=True, slots=True)
class Profile:
    """Sizes of one benchmark run (the full GPU run or the CPU smoke run)."""

    device: str  # "cuda" or "cpu"
    num_q_heads: int  # query heads of the model
    num_kv_heads: int  # KV heads of the model
    head_dim: int  # elements per head
    block_size: int  # KV-cache block size
    batches: tuple[int, ...]  # decode batch sizes
    contexts: tuple[int, ...]  # decode context lengths (tokens incl. the new one)
    max_total_context: int  # skip decode cases whose batch x context exceeds this
    mixed: tuple[Case, ...]  # mixed prefill + decode cases
    gate: tuple[Case, ...]  # correctness-gate batches
    split_sweep: tuple[tuple[int, int], ...]  # (batch, context) decode cases for the split sweep
    splits: tuple[int, ...]  # split counts tried there
    decode_configs: tuple[TileConfig, ...]  # decode tile configs tried on the first sweep case
    unified_configs: tuple[TileConfig, ...]  # unified tile configs tried on the first mixed case
    copy_bytes: int  # copy-bandwidth buffer size
    flush_bytes: int  # buffer overwritten before each timed call (H200 L2: 50 MiB)
    iters: int  # timed calls per measurement
    warmup: int  # untimed calls before timing


def _tiles(*configs: tuple[int, int, int, int]) -> tuple[TileConfig, ...]:
    return tuple(TileConfig(*c) for c in configs)  # (block_m, tile_size, num_warps, num_stages)


GPU_PROFILE = Profile(
    device="cuda", num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
    batches=(1, 8, 32, 64, 128, 256), contexts=(512, 2048, 4096, 8192, 16384, 32768),
    max_total_context=2 * 2**20,
    mixed=(
        _case("prefill 1x4096", [(4096, 0)]),
        _case("prefill 4x1024", [(1024, 0)] * 4),
        _case("chunk 2048 on 8k ctx", [(2048, 8192)]),
        _case("chunk 512@2k + 64 dec@4k", [(512, 2048)], 64, 4096),
        _case("2 chunks 1024 + 128 dec@2k", [(1024, 0), (1024, 3072)], 128, 2048),
    ),
    gate=(
        _case("mixed", [(300, 900), (77, 0)], 3, 2000),
        _case("decode", [], 5, 5000),
        _case("decode-ragged", [(1, 0), (1, 17), (1, 2048), (1, 777), (1, 64)]),
    ),
    split_sweep=((32, 8192), (1, 32768), (8, 8192), (32, 4096)), splits=(1, 2, 4, 8, 16, 32),
    decode_configs=_tiles((16, 32, 4, 2), (16, 64, 4, 2), (16, 64, 4, 3), (16, 128, 4, 2),
                          (16, 64, 8, 3)),
    unified_configs=_tiles((64, 32, 4, 2), (64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2),
                           (128, 64, 8, 3)),
    copy_bytes=2 * 2**30, flush_bytes=256 * 2**20, iters=20, warmup=3,
)
SMOKE_PROFILE = Profile(
    device="cpu", num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
    batches=(1, 2), contexts=(16, 40), max_total_context=10**9,
    mixed=(_case("chunk 12@20 + 2 dec@30", [(12, 20)], 2, 30),),
    gate=(_case("mixed", [(5, 10), (17, 0)], 2, 50), _case("decode", [], 3, 70)),
    split_sweep=((1, 40),), splits=(1, 2),
    decode_configs=_tiles((16, 16, 4, 2)), unified_configs=_tiles((16, 16, 4, 2)),
    copy_bytes=16 * 2**20, flush_bytes=2**20, iters=1, warmup=0,
)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the main table (and one record of ``--out``)."""

    case: str  # case name
    plan: str  # kernel/splits the selection rule picked
    ours_ms: float  # median time of paged_attention
    sdpa_ms: float  # median time of the SDPA baseline (nan when it failed)
    bytes_moved: int  # unique bytes: K/V of every context + query + output
    ours_gbps: float  # bytes_moved / ours_ms
    ours_pct_copy: float  # ours_gbps as % of measured copy bandwidth
    sdpa_gbps: float  # bytes_moved / sdpa_ms
    ours_tflops: float  # causal attention FLOPs / ours_ms
    sdpa_tflops: float  # causal attention FLOPs / sdpa_ms


def make_case(profile: Profile, case: Case, dtype: torch.dtype = torch.bfloat16,
              seed: int = SEED) -> tuple[BatchSpec, PagedBatch]:
    """A poisoned random batch of ``case`` on the profile's device."""
    _, q_lens, ctx_lens = case
    spec = BatchSpec(
        query_lens=q_lens, context_lens=ctx_lens, num_q_heads=profile.num_q_heads,
        num_kv_heads=profile.num_kv_heads, head_dim=profile.head_dim,
        block_size=profile.block_size, dtype=dtype, seed=seed,
    )
    return spec, make_paged_batch(spec, profile.device)


def correctness_gate(profile: Profile) -> list[str]:
    """Every kernel path against the reference on random data; returns the failing lines."""
    failures = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for case in profile.gate:
            failures += _gate_case(profile, case, dtype)
    return failures


def _gate_case(profile: Profile, case: Case, dtype: torch.dtype) -> list[str]:
    from kernels.triton_decode import decode_attention
    from kernels.triton_unified import unified_attention

    _, batch = make_case(profile, case, dtype, seed=SEED + 1)
    args, kwargs = batch.attention_args(), batch.attention_kwargs()
    dims = validate_attention_inputs(*args, **kwargs)
    expected = paged_attention_reference(*args, **kwargs)
    fresh = functools.partial(torch.empty_like, batch.query)
    runs = {
        "auto": functools.partial(paged_attention, *args, **kwargs, backend="triton"),
        "unified": lambda: unified_attention(*args, fresh(), dims=dims, scale=batch.scale),
    }
    if dims.is_decode_only:
        for splits in (1, 3, 8):
            runs[f"splits={splits}"] = lambda s=splits: decode_attention(
                *args, fresh(), dims=dims, scale=batch.scale, num_splits=s)
    tol = attention_tolerance(dtype)
    failures = []
    for name, launch in runs.items():
        try:
            out = launch()
        except Exception:  # a kernel that cannot launch fails the gate, loudly
            traceback.print_exc()
            failures.append(f"{case[0]} {dtype} {name}: raised")
            continue
        err = (out.float() - expected.float()).abs()
        bound = tol.atol + tol.rtol * expected.float().abs()
        ok = bool(torch.isfinite(out).all()) and bool((err <= bound).all())
        line = (f"  {case[0]:13s} {str(dtype)[6:]:9s} {name:9s} "
                f"max_abs_err={float(err.max()):.2e} {'PASS' if ok else 'FAIL'}")
        print(line, flush=True)
        if not ok:
            failures.append(line.strip())
    return failures


def bench_case(profile: Profile, timer: Timer, copy_gbps: float, case: Case) -> Row:
    """Time paged_attention and the SDPA baseline on one case."""
    spec, batch = make_case(profile, case)
    dims = validate_attention_inputs(*batch.attention_args(), **batch.attention_kwargs())
    plan = plan_for(dims, batch.query.device)
    out = torch.empty_like(batch.query)
    ours_ms = timer.median_ms(lambda: paged_attention(
        *batch.attention_args(), **batch.attention_kwargs(), out=out, backend="triton"))
    try:
        sdpa_ms = timer.median_ms(sdpa_baseline(batch, spec))
    except RuntimeError as exc:  # e.g. out of memory: keep the row, without a baseline
        print(f"  SDPA baseline failed on {case[0]}: {exc!r}"[:240], flush=True)
        sdpa_ms = float("nan")
    moved, flops = attention_bytes(spec), attention_flops(spec)
    return Row(
        case=case[0], plan=f"{plan.kernel.value}/{plan.num_splits}", ours_ms=ours_ms,
        sdpa_ms=sdpa_ms, bytes_moved=moved, ours_gbps=moved / ours_ms / 1e6,
        ours_pct_copy=100 * moved / ours_ms / 1e6 / copy_gbps, sdpa_gbps=moved / sdpa_ms / 1e6,
        ours_tflops=flops / ours_ms / 1e9, sdpa_tflops=flops / sdpa_ms / 1e9,
    )


def tuning_sweeps(profile: Profile, timer: Timer, deadline: float) -> list[str]:
    """Split counts on decode cases, then tile configs of both kernels; returns the lines."""
    lines: list[str] = []
    for index, (batch_size, context) in enumerate(profile.split_sweep):
        if time.monotonic() > deadline:
            lines.append(f"  decode B={batch_size} ctx={context}: skipped (time budget)")
            print(lines[-1], flush=True)
            continue
        case = _case(f"decode B={batch_size} ctx={context}", [], batch_size, context)
        configs = profile.decode_configs if index == 0 else ()
        lines += _sweep_decode(profile, timer, case, configs)
    if profile.mixed and time.monotonic() <= deadline:
        lines += _sweep_unified(profile, timer, profile.mixed[0])
    return lines


def _sweep_decode(profile: Profile, timer: Timer, case: Case,
                  configs: Sequence[TileConfig]) -> list[str]:
    """Decode time per split count, then per tile config at the rule's split count."""
    from kernels.triton_decode import decode_attention

    _, batch = make_case(profile, case)
    args, out = batch.attention_args(), torch.empty_like(batch.query)
    dims = validate_attention_inputs(*args, **batch.attention_kwargs())
    picked = plan_for(dims, batch.query.device).num_splits
    cells = []
    for splits in profile.splits:
        ms = timer.median_ms(lambda s=splits: decode_attention(
            *args, out, dims=dims, scale=batch.scale, num_splits=s))
        cells.append(f"{splits}{'*' if splits == picked else ''}:{ms:.4f}")
    lines = [f"  {case[0]} ms by num_splits (*=rule): {' '.join(cells)}"]
    for cfg in configs:
        ms = timer.median_ms(lambda c=cfg: decode_attention(
            *args, out, dims=dims, scale=batch.scale, num_splits=picked, config=c))
        lines.append(f"    decode config {_label(cfg)}: {ms:.4f} ms")
    print("\n".join(lines), flush=True)
    return lines


def _sweep_unified(profile: Profile, timer: Timer, case: Case) -> list[str]:
    """Unified-kernel time and TFLOP/s per tile config on one case."""
    from kernels.triton_unified import unified_attention

    spec, batch = make_case(profile, case)
    args, out = batch.attention_args(), torch.empty_like(batch.query)
    dims = validate_attention_inputs(*args, **batch.attention_kwargs())
    lines = []
    for cfg in profile.unified_configs:
        ms = timer.median_ms(lambda c=cfg: unified_attention(
            *args, out, dims=dims, scale=batch.scale, config=c))
        lines.append(f"    unified config {_label(cfg)} on {case[0]}: {ms:.4f} ms, "
                     f"{attention_flops(spec) / ms / 1e9:.1f} TFLOP/s")
    print("\n".join(lines), flush=True)
    return lines


def _label(cfg: TileConfig) -> str:
    return f"m{cfg.block_m}/t{cfg.tile_size}/w{cfg.num_warps}/s{cfg.num_stages}"


def decode_cases(profile: Profile) -> list[Case]:
    """Every decode case within the profile's total-context cap."""
    return [_case(f"decode B={b} ctx={c}", [], b, c) for b in profile.batches
            for c in profile.contexts if b * c <= profile.max_total_context]


HEADER = (f"{'case':28s} {'plan':10s} {'ours ms':>9s} {'sdpa ms':>9s} {'MB':>9s} "
          f"{'ours GB/s':>9s} {'%copy':>6s} {'sdpa GB/s':>9s} {'ours TF/s':>9s} "
          f"{'sdpa TF/s':>9s} {'vs sdpa':>8s}")


def format_row(row: Row) -> str:
    """One fixed-width line of the main table."""
    return (f"{row.case:28s} {row.plan:10s} {row.ours_ms:9.4f} {row.sdpa_ms:9.4f} "
            f"{row.bytes_moved / 1e6:9.2f} {row.ours_gbps:9.1f} {row.ours_pct_copy:6.1f} "
            f"{row.sdpa_gbps:9.1f} {row.ours_tflops:9.2f} {row.sdpa_tflops:9.2f} "
            f"{speedup(row.sdpa_ms, row.ours_ms):7.2f}x")


def run(profile: Profile, budget_s: float, out_path: Path | None) -> int:
    """The whole benchmark; returns the exit code (1 when the correctness gate failed)."""
    import triton

    started = time.monotonic()
    deadline = started + budget_s
    device_name = (torch.cuda.get_device_name() if profile.device == "cuda"
                   else f"cpu ({platform.machine()}, Triton interpreter)")
    versions = {"torch": torch.__version__, "triton": triton.__version__,
                "python": platform.python_version()}
    print(f"device: {device_name}; {versions}", flush=True)
    timer = Timer(profile.device, iters=profile.iters, warmup=profile.warmup,
                  flush_bytes=profile.flush_bytes)
    copy_gbps = measure_copy_gbps(timer, profile.copy_bytes)
    print(f"copy bandwidth: {copy_gbps:.1f} GB/s (read + write)\ncorrectness gate:", flush=True)
    failures = correctness_gate(profile)
    print(f"correctness: {'PASS' if not failures else f'FAIL ({len(failures)})'}", flush=True)
    rows: list[Row] = []
    skipped: list[str] = []
    for case in [*decode_cases(profile), *profile.mixed]:
        if time.monotonic() > deadline:
            skipped.append(f"{case[0]} (time budget)")
            continue
        try:
            rows.append(bench_case(profile, timer, copy_gbps, case))
        except Exception as exc:  # keep going: one failing case must not cost the whole table
            traceback.print_exc()
            skipped.append(f"{case[0]} ({type(exc).__name__})")
            continue
        print(f"  {format_row(rows[-1])}  [{time.monotonic() - started:.0f}s]", flush=True)
        if profile.device == "cuda":
            torch.cuda.empty_cache()
    print("tuning sweeps (median ms):", flush=True)
    sweeps = tuning_sweeps(profile, timer, deadline)
    elapsed_s = time.monotonic() - started
    if out_path is not None:
        out_path.write_text(json.dumps({
            "profile": asdict(profile), "seed": SEED, "device": device_name,
            "versions": versions, "copy_gbps": copy_gbps, "gate_failures": failures,
            "rows": [asdict(r) for r in rows], "skipped": skipped, "sweeps": sweeps,
            "elapsed_s": elapsed_s,
        }, indent=1))
    print(f"\npaged attention, bf16, one layer, {profile.num_q_heads}/{profile.num_kv_heads} "
          f"heads x {profile.head_dim}; copy bandwidth {copy_gbps:.1f} GB/s; correctness "
          f"{'PASS' if not failures else 'FAIL'}; {elapsed_s:.0f}s total")
    print(HEADER)
    print("\n".join(format_row(row) for row in rows))
    if skipped:
        print(f"skipped: {', '.join(skipped)}")
    sys.stdout.flush()
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description="Benchmark twinserve's paged attention.")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU with the Triton interpreter")
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="start no new case after this many seconds")
    parser.add_argument("--out", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels' Triton modules load
        profile = SMOKE_PROFILE
    elif torch.cuda.is_available():
        profile = GPU_PROFILE
    else:
        print("no CUDA device; use --smoke for the CPU interpreter run", file=sys.stderr)
        return 2
    torch.manual_seed(SEED)
    return run(profile, args.budget_s, args.out)


if __name__ == "__main__":
    sys.exit(main())
