"""Tensor and pipeline parallelism on the real engine, on CPU (gloo): every layout generates
exactly what one rank does, token for token, over a batch whose schedule chunks prefills and
preempts requests; bad layouts are one clear error each.

Each layout runs in worker processes (one per rank) behind the multiprocess executor, so the
cases are few and small: the Llama checkpoint at TP 2, PP 2 and TP 2 × PP 2, and a Qwen2-style
one (QKV bias, tied embeddings that the last stage copies, one KV head that TP 2 replicates, a
vocabulary TP does not divide) at TP 2 × PP 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.core.config import ConfigError
from engine.core.request import SamplingParams
from engine.llm import LLM, EngineArgs
from engine.worker.tiny_model import TinyModelSpec, make_tiny_model

#: A schedule that chunks prefills (8-token budget) and preempts (13 blocks of 4 tokens).
ENGINE: dict[str, Any] = {
    "device": "cpu", "max_model_len": 48, "max_num_batched_tokens": 8, "max_num_seqs": 4,
    "block_size": 4, "num_gpu_blocks": 13,
}


def _prompts() -> list[list[int]]:
    return [[1 + (i * 37 + k) % 300 for k in range(5 + 6 * i)] for i in range(4)]


def _params() -> list[SamplingParams]:
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_k=20, seed=7, ignore_eos=True)
    return [greedy, seeded, greedy, greedy]


def _generate(model: Path, **layout: Any) -> tuple[list[list[int]], int, int]:
    """Output tokens per prompt, preempted requests and chunked prefill steps of one run."""
    llm = LLM(str(model), **ENGINE, **layout)
    try:
        outputs = llm.generate(_prompts(), _params())
        steps = llm.core.event_log.export()["steps"]
    finally:
        llm.shutdown()
    prompt_lens = {len(p) for p in _prompts()}
    chunked = sum(1 for n, t in zip(steps["num_prefill_reqs"], steps["num_tokens"], strict=True)
                  if n and t == ENGINE["max_num_batched_tokens"] and t not in prompt_lens)
    return ([list(o.output_token_ids) for o in outputs], sum(steps["num_preempted_reqs"]),
            chunked)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("llama"), TinyModelSpec(arch="llama"))


@pytest.fixture(scope="module")
def qwen_mqa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(arch="qwen2", num_key_value_heads=1, vocab_size=383, num_shards=2)
    return make_tiny_model(tmp_path_factory.mktemp("qwen"), spec)


@pytest.fixture(scope="module")
def llama_reference(llama: Path) -> list[list[int]]:
    torch.set_num_threads(1)
    tokens, preempted, chunked = _generate(llama)
    assert preempted > 0 and chunked > 0  # the schedule does what the cases are for
    return tokens


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)], ids=["tp2", "pp2", "tp2xpp2"])
def test_llama_layouts_generate_what_one_rank_does(
    llama: Path, llama_reference: list[list[int]], tp: int, pp: int
) -> None:
    tokens, preempted, _ = _generate(llama, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    assert preempted > 0
    assert tokens == llama_reference


def test_tp2_pp2_with_replicated_kv_heads_tied_embeddings_and_padded_vocab(
    qwen_mqa: Path,
) -> None:
    torch.set_num_threads(1)
    reference, preempted, chunked = _generate(qwen_mqa)
    assert preempted > 0 and chunked > 0
    tokens, _, _ = _generate(qwen_mqa, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert tokens == reference


def test_bad_layouts_fail_before_any_worker_starts(llama: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not divide .* 4 attention heads"):
        EngineArgs(str(llama), device="cpu", tensor_parallel_size=3).build()
    with pytest.raises(ConfigError, match=r"pipeline_parallel_size 3 exceeds .* 2 decoder layers"):
        EngineArgs(str(llama), device="cpu", pipeline_parallel_size=3).build()
    with pytest.raises(ConfigError, match="async scheduling is not supported with pipeline"):
        EngineArgs.from_kwargs(str(llama), pipeline_parallel_size=2, async_scheduling=True)
    with pytest.raises(ConfigError, match="needs the multiprocess executor"):
        EngineArgs(str(llama), tensor_parallel_size=2, distributed_executor_backend="uni")


def test_generate_command_takes_the_layout(llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    def generate(*layout: str) -> str:
        argv = ["generate", "--model", str(llama), "--device", "cpu", "--json", "--max-tokens",
                "6", "--prompt-token-ids", "5,6,7,8", "--prompt-token-ids", "9,10,11", *layout]
        assert main(argv) == 0
        return capsys.readouterr().out

    one_rank = generate()
    assert one_rank.count("\n") == 2
    assert generate("-tp", "2", "-pp", "2") == one_rank
