"""Property: no scheduling knob changes what is generated (greedy or seeded sampling).

Each case draws, from a seeded generator, a batch of requests (prompt lengths, a shared prefix,
max/min tokens, greedy or seeded temperature/top-k/top-p sampling) and runs it under one
scheduling regime (token budget, KV blocks scarce enough to preempt, prefix caching, chunked
prefill, async scheduling, priority policy). Stop tokens are taken from a first run's outputs,
so requests really stop early (and ``min_tokens`` really bans them). The outputs must equal,
request by request, those of a roomy synchronous run, and each regime must have done what it is
for (e.g. preempted). Unseeded random sampling is excluded: its draws come from the engine-wide
generator, so they legitimately depend on the batch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.core.request import SamplingParams
from engine.llm import LLM
from tests.worker.hf_reference import random_prompts

MAX_MODEL_LEN = 40
ROOMY: dict[str, Any] = {"kv_cache_memory": 1 << 22}
REGIMES: list[dict[str, Any]] = [
    {"max_num_batched_tokens": 5, "num_gpu_blocks": 12},
    {"max_num_batched_tokens": 8, "num_gpu_blocks": 12, "async_scheduling": True},
    {"max_num_batched_tokens": 64, "num_gpu_blocks": 13, "policy": "priority"},
    {"max_num_batched_tokens": 16, "async_scheduling": True, "enable_prefix_caching": False},
    {"max_num_batched_tokens": 64, "num_gpu_blocks": 11, "async_scheduling": True,
     "policy": "priority"},
]


def make_workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    n = rng.randint(4, 6)
    prompts = random_prompts([rng.randint(1, 24) for _ in range(n)], 384, seed=seed)
    prefix = prompts[0][: rng.randint(4, 20)]
    prompts = [prefix + p if rng.random() < 0.5 else p for p in prompts]
    params = []
    for _ in prompts:
        max_tokens = rng.randint(10, 20)
        sampled = rng.random() < 0.5
        params.append(SamplingParams(
            max_tokens=max_tokens,
            min_tokens=rng.choice([0, 0, 3]),
            temperature=rng.choice([0.7, 1.0, 1.5]) if sampled else 0.0,
            top_k=rng.choice([0, 5, 50]) if sampled else 0,
            top_p=rng.choice([1.0, 0.9]) if sampled else 1.0,
            seed=rng.randrange(2**31) if sampled else None,
        ))
    return [p[: MAX_MODEL_LEN - 1] for p in prompts], params


def with_stop_tokens(
    params: list[SamplingParams], outputs: list[list[int]], seed: int
) -> list[SamplingParams]:
    """Every other request stops at a token it generated (in its second half) in a first run."""
    rng = random.Random(seed)
    result = []
    for i, (p, out) in enumerate(zip(params, outputs, strict=True)):
        if i % 2 == 0 and len(out) > 2:
            stop = out[rng.randint(len(out) // 2, len(out) - 2)]
            p = SamplingParams(**{**_fields(p), "stop_token_ids": (stop,)})
        result.append(p)
    return result


def _fields(p: SamplingParams) -> dict[str, Any]:
    return {name: getattr(p, name) for name in p.__dataclass_fields__}


def run(model_dir: Path, prompts: list[list[int]], params: list[SamplingParams],
        knobs: dict[str, Any]) -> tuple[list[tuple[list[int], str | None]], LLM]:
    budget = knobs.get("max_num_batched_tokens", 2048)
    llm = LLM(str(model_dir), device="cpu", block_size=4, max_model_len=MAX_MODEL_LEN,
              max_num_seqs=min(4, budget), **knobs)
    outputs = llm.generate(prompts, params)
    return [(o.output_token_ids, o.finish_reason) for o in outputs], llm


@pytest.mark.parametrize("seed", range(len(REGIMES)))
def test_outputs_do_not_depend_on_scheduling(seed: int, llama_dir: Path) -> None:
    prompts, params = make_workload(seed)
    first, _ = run(llama_dir, prompts, params, ROOMY)
    params = with_stop_tokens(params, [tokens for tokens, _ in first], seed)
    expected, _ = run(llama_dir, prompts, params, ROOMY)
    regime = REGIMES[seed % len(REGIMES)]
    got, llm = run(llama_dir, prompts, params, regime)
    assert got == expected
    assert any(reason == "stop" for _, reason in expected)
    if regime.get("num_gpu_blocks", 64) <= 13:
        assert llm.core.scheduler.num_preemptions > 0
