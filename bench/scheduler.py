"""Benchmark: microseconds per engine step for N running decode requests (prefix caching on).

Mirrors the vLLM oracle's ``sched_speed.py`` so the two can be run side by side on one machine:
N requests with distinct 500-token prompts, budget 8192, max_num_seqs 1024, 200k blocks,
max_model_len 32768; 300 steps of ``schedule()`` + ``update_from_output()``; the median over
pure decode steps (every running request scheduled one token) is reported, per step and per
request. ``--engine-core`` times the full ``EngineCore`` step instead (event log included).

Usage: python -m bench.scheduler [--steps 300] [--sizes 16,64,256,1024] [--engine-core]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.hashing import TokenBlockHasher
from engine.core.outputs import ModelRunnerOutput
from engine.core.request import Request, SamplingParams


def _make_core(num_running: int) -> EngineCore:
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=32768
        ),
        cache=CacheConfig(num_gpu_blocks=200_000, block_size=16, enable_prefix_caching=True),
    )
    core = EngineCore(config)
    hasher = TokenBlockHasher(16)
    params = SamplingParams(max_tokens=100_000, ignore_eos=True)
    for i in range(num_running):
        prompt = [1000 + i * 7919 + k for k in range(500)]
        core.add_request(
            Request(str(i), sampling_params=params, prompt_token_ids=prompt, block_hasher=hasher),
            0.0,
        )
    return core


def run(num_running: int, steps: int, engine_core: bool) -> tuple[int, float]:
    """Returns (decode steps measured, median µs per step)."""
    core = _make_core(num_running)
    scheduler = core.scheduler
    times: list[float] = []
    gc.collect()
    for step in range(steps):
        t0 = time.perf_counter()
        if engine_core:
            out = core.begin_step(float(step))
            assert out is not None
            sampled = {
                r: [7] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids
            }
            core.finish_step(out, ModelRunnerOutput(sampled), float(step))
        else:
            out = scheduler.schedule()
            sampled = {
                r: [7] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids
            }
            scheduler.update_from_output(out, ModelRunnerOutput(sampled))
        elapsed = time.perf_counter() - t0
        if out.total_num_scheduled_tokens == num_running and out.batch_shape.num_decode_reqs == (
            num_running
        ):
            times.append(elapsed)
    return len(times), statistics.median(times) * 1e6 if times else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sizes", default="16,64,256,1024")
    parser.add_argument("--engine-core", action="store_true", help="time EngineCore steps")
    args = parser.parse_args(argv)
    what = "EngineCore step" if args.engine_core else "schedule+update"
    for n in (int(s) for s in args.sizes.split(",")):
        count, median_us = run(n, args.steps, args.engine_core)
        print(
            f"running={n}: decode steps measured={count} median {what} = {median_us:.0f} us "
            f"= {median_us / n:.2f} us/request",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
