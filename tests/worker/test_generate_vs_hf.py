"""End to end: ``LLM.generate`` (greedy, fp32, CPU) equals Hugging Face's greedy decoding, token for
token, under every scheduling regime — scheduling must never change what is generated.

Each regime is checked to have really happened (chunks were split, requests were preempted,
prefixes hit the cache, two batches were in flight), so a regime silently turned off cannot pass
for a working one. The reference's smallest top-1/top-2 logit gap is asserted to be far above
fp32 rounding, so an exact comparison of generated tokens is meaningful.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.core.request import SamplingParams
from engine.llm import LLM
from tests.worker.hf_reference import hf_greedy, random_prompts

MAX_TOKENS = 16
PROMPT_LENGTHS = [7, 13, 21, 30]
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
#: Smallest top-1/top-2 logit gap of the reference for an exact comparison (fp32 noise ~1e-6).
MIN_MARGIN = 1e-4

REGIMES: dict[str, dict[str, Any]] = {
    "plain": {},
    "chunked-prefill": {"max_num_batched_tokens": 8, "max_num_seqs": 4},
    "preemption": {"num_gpu_blocks": 16, "max_model_len": 48},
    "async": {"async_scheduling": True},
    "async-chunked-preemption": {
        "async_scheduling": True, "max_num_batched_tokens": 8, "max_num_seqs": 4,
        "num_gpu_blocks": 16, "max_model_len": 48,
    },
    "no-chunking-no-prefix-cache": {
        "enable_chunked_prefill": False, "enable_prefix_caching": False, "max_model_len": 64,
    },
}


def make_llm(model_dir: Path, **knobs: Any) -> LLM:
    knobs.setdefault("kv_cache_memory", 1 << 22)
    return LLM(str(model_dir), block_size=4, device="cpu", **knobs)


def reference(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    refs = [hf_greedy(model_dir, p, MAX_TOKENS) for p in prompts]
    assert min(r.min_margin for r in refs) > MIN_MARGIN, "near-tie: pick another seed"
    return [r.token_ids for r in refs]


def assert_regime_happened(name: str, llm: LLM) -> None:
    scheduler = llm.core.scheduler
    timings = llm.executor.step_timings
    if "chunked" in name:
        max_prompt = max(PROMPT_LENGTHS)
        assert all(t.batch_shape.num_tokens <= 8 for t in timings)
        assert any(0 < q < max_prompt for t in timings for q in t.batch_shape.prefill_query_lens)
        assert any(ctx > 0 for t in timings for ctx in t.batch_shape.prefill_context_lens)
    if "preemption" in name:
        assert scheduler.num_preemptions > 0
    if "async" in name:  # some step was scheduled before the previous one was applied
        steps = llm.core.event_log.steps_columns()
        scheduled, applied = list(steps["schedule_time_s"]), list(steps["update_time_s"])
        assert any(s < a for s, a in zip(scheduled[1:], applied, strict=False))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("regime", list(REGIMES))
def test_greedy_equals_transformers(
    regime: str, arch: str, llama_dir: Path, qwen2_dir: Path
) -> None:
    model_dir = llama_dir if arch == "llama" else qwen2_dir
    llm = make_llm(model_dir, **REGIMES[regime])
    prompts = random_prompts(PROMPT_LENGTHS, llm.engine.model_config.vocab_size, seed=1234)
    outputs = llm.generate(prompts, GREEDY)
    assert [o.output_token_ids for o in outputs] == reference(model_dir, prompts)
    assert all(o.finish_reason == "length" for o in outputs)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert_regime_happened(regime, llm)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_prefix_cache_hits_do_not_change_outputs(async_scheduling: bool, llama_dir: Path) -> None:
    """Shared prefixes (in one batch, and again in a second call) hit the cache; same tokens."""
    llm = make_llm(llama_dir, async_scheduling=async_scheduling)
    vocab = llm.engine.model_config.vocab_size
    shared = random_prompts([17], vocab, seed=5)[0]
    tails = random_prompts([3, 9, 1], vocab, seed=6)
    prompts = [shared + t for t in tails] + [shared[:12]]
    expected = reference(llama_dir, prompts)
    first = llm.generate(prompts, GREEDY)
    stats = llm.core.scheduler.kv_cache_manager.prefix_cache_stats
    hits_in_batch = stats.hits
    second = llm.generate(prompts, GREEDY)
    assert [o.output_token_ids for o in first] == expected
    assert [o.output_token_ids for o in second] == expected
    assert hits_in_batch > 0
    assert stats.hits > hits_in_batch + sum(len(p) for p in prompts) // 2


def test_generate_mixes_text_and_token_prompts(llama_dir: Path) -> None:
    llm = make_llm(llama_dir)
    tokenizer = llm.get_tokenizer()
    assert tokenizer is not None
    text_out, ids_out = llm.generate(
        ["The engine schedules", tokenizer.encode("The engine schedules")], GREEDY
    )
    assert text_out.prompt == "The engine schedules"
    assert text_out.prompt_token_ids == ids_out.prompt_token_ids
    assert text_out.output_token_ids == ids_out.output_token_ids
    assert text_out.text == tokenizer.decode(text_out.output_token_ids)
