"""The model over a paged KV cache agrees with ``transformers`` logit for logit (teacher forcing).

Two sequences are run through our ``LlamaModel`` in a mixed varlen schedule — prefill chunks of
odd sizes next to single-token decodes, blocks scattered in the cache in reverse order — and
every row's fp32 logits are compared with the logits of one full-sequence forward of Hugging
Face's ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (eager attention). Teacher forcing makes the
comparison immune to near-ties. Mutation checks prove the test has teeth: a wrong RoPE, wrong
positions, a wrong GQA head mapping or a lost KV cache each break it by orders of magnitude.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.worker.attention import AttentionMetadata, PagedAttention
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from engine.worker.loader import load_model
from engine.worker.model import LlamaModel
from engine.worker.model_runner import build_attention_metadata
from engine.worker.rope import RotaryEmbedding
from tests.worker.hf_reference import hf_logits, random_prompts

#: The Triton interpreter (3.6) trips a numpy deprecation warning on every launch.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:triton")

BLOCK_SIZE = 4
#: (sequence, tokens) chunks per step: mixed prefill chunks and decodes.
SCHEDULE: list[list[tuple[int, int]]] = [
    [(0, 13), (1, 19)],  # a prefill chunk next to a whole prefill
    [(0, 1), (1, 1)],  # a one-token chunk and a decode
    [(1, 1), (0, 16)],  # a decode next to a chunk that spans several blocks
    [(0, 1), (1, 1)],  # two decodes
    [(1, 3), (0, 2)],  # small multi-token chunks after the prefill
]
Mutation = Callable[[LlamaModel, torch.Tensor, AttentionMetadata, list], torch.Tensor] | None


def run_paged(
    model: LlamaModel, sequences: list[list[int]], mutate_positions: Mutation = None,
    drop_cache: bool = False,
) -> list[torch.Tensor]:
    """Logits ``[len(seq), vocab]`` per sequence, computed step by step over the paged cache."""
    spec = KVCacheSpec.for_model(model.config, BLOCK_SIZE, model.dtype)
    caches = allocate_kv_caches(spec, 40, model.device)
    for k, v in caches:  # a correct forward never reads a slot it has not written
        k.fill_(float("nan"))
        v.fill_(float("nan"))
    tables = [list(range(39, 20, -1)), list(range(20, 0, -1))]
    done = [0, 0]
    logits: list[list[torch.Tensor]] = [[], []]
    with torch.inference_mode():
        for step in SCHEDULE:
            ids = [t for s, n in step for t in sequences[s][done[s] : done[s] + n]]
            positions, meta = build_attention_metadata(
                [tables[s] for s, _ in step], [done[s] for s, _ in step], [n for _, n in step],
                BLOCK_SIZE, model.device,
            )
            if mutate_positions is not None:
                positions = mutate_positions(model, positions, meta, step)
            hidden = model(torch.tensor(ids), positions, caches, meta)
            rows = model.compute_logits(hidden)
            offset = 0
            for s, n in step:
                logits[s].append(rows[offset : offset + n])
                offset += n
                done[s] += n
            if drop_cache:
                for k, v in caches:
                    k.zero_()
                    v.zero_()
    return [torch.cat(chunks) for chunks in logits]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_sequences(
    request: pytest.FixtureRequest, llama_dir: Path, qwen2_dir: Path
) -> tuple[Path, LlamaModel, list[list[int]]]:
    model_dir = llama_dir if request.param == "llama" else qwen2_dir
    model = load_model(str(model_dir), device="cpu", attention_backend="reference")
    used = [sum(n for step in SCHEDULE for s, n in step if s == seq) for seq in (0, 1)]
    return model_dir, model, random_prompts(used, model.config.vocab_size, seed=7)


def max_error(model_dir: Path, ours: list[torch.Tensor], sequences: list[list[int]]) -> float:
    return max(
        float((mine - hf_logits(model_dir, seq)).abs().max())
        for mine, seq in zip(ours, sequences, strict=True)
    )


def test_paged_chunked_logits_match_transformers(model_and_sequences) -> None:
    model_dir, model, sequences = model_and_sequences
    ours = run_paged(model, sequences)
    for mine, seq in zip(ours, sequences, strict=True):
        ref = hf_logits(model_dir, seq)
        assert mine.shape == ref.shape
        torch.testing.assert_close(mine, ref, atol=1e-4, rtol=1e-4)
        assert torch.equal(mine.argmax(-1), ref.argmax(-1))


def _positions_restart_per_chunk(model, positions, meta, step):
    """A classic chunked-prefill bug: positions counted from the chunk, not the sequence.

    (A uniform shift would not do: RoPE scores depend on relative positions only.)
    """
    return torch.cat([torch.arange(n) for _, n in step])


def test_mutations_break_the_comparison(model_and_sequences) -> None:
    """Each classic bug moves the logits far beyond the 1e-4 tolerance used above."""
    model_dir, model, sequences = model_and_sequences
    wrong = run_paged(model, sequences, _positions_restart_per_chunk)
    assert max_error(model_dir, wrong, sequences) > 1e-2
    assert max_error(model_dir, run_paged(model, sequences, drop_cache=True), sequences) > 1e-2
    good_rotary = model.rotary
    try:  # RoPE with a wrong base frequency
        wrong = dataclasses.replace(model.config.rope, rope_type="default", rope_theta=5000.0)
        model.rotary = RotaryEmbedding(wrong, model.config.head_dim, model.device)
        assert max_error(model_dir, run_paged(model, sequences), sequences) > 1e-2
    finally:
        model.rotary = good_rotary
    good_attention = model.attention

    class SwappedKVHeads(PagedAttention):  # queries read the other GQA group's K/V
        def __call__(self, q, k, v, k_cache, v_cache, meta):
            return super().__call__(q, k.flip(1), v.flip(1), k_cache, v_cache, meta)

    try:
        model.set_attention(SwappedKVHeads(good_attention.backend, good_attention.scale))
        assert max_error(model_dir, run_paged(model, sequences), sequences) > 1e-2
    finally:
        model.set_attention(good_attention)


def test_triton_interpreter_inside_the_model(llama_dir: Path) -> None:
    """The Triton kernels (interpreted on CPU) give the reference's logits inside the model."""
    from kernels import is_triton_interpreter_enabled

    if not is_triton_interpreter_enabled():
        pytest.skip("TRITON_INTERPRET=1 must be set before the kernels are first launched")
    reference = load_model(str(llama_dir), device="cpu", attention_backend="reference")
    triton = load_model(str(llama_dir), device="cpu", attention_backend="triton")
    sequences = random_prompts([5, 4], reference.config.vocab_size, seed=3)
    spec = KVCacheSpec.for_model(reference.config, BLOCK_SIZE, torch.float32)
    results = []
    for model in (reference, triton):
        caches = allocate_kv_caches(spec, 8, torch.device("cpu"))
        rows = []
        done = [0, 0]
        tables = [[1, 2, 3], [7, 5]]
        with torch.inference_mode():
            # A prefill, then a mixed step (unified kernel), then a decode (decode kernel).
            for step in ([(0, 4)], [(0, 1), (1, 3)], [(1, 1)]):
                ids = [t for s, n in step for t in sequences[s][done[s] : done[s] + n]]
                positions, meta = build_attention_metadata(
                    [tables[s] for s, _ in step], [done[s] for s, _ in step],
                    [n for _, n in step], BLOCK_SIZE, torch.device("cpu"),
                )
                hidden = model(torch.tensor(ids), positions, caches, meta)
                rows.append(model.compute_logits(hidden))
                for s, n in step:
                    done[s] += n
        results.append(torch.cat(rows))
    assert triton.attention.backend.value == "triton"
    torch.testing.assert_close(results[1], results[0], atol=1e-4, rtol=1e-4)


def test_llama31_8b_config_and_rope_match_transformers() -> None:
    """The GPU smoke run's 8B shape: parameter count and llama3-scaled RoPE frequencies."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from bench.gpu_real_smoke import LLAMA_31_8B
    from engine.worker.model_config import ModelConfig
    from engine.worker.rope import compute_inv_freq

    config = ModelConfig.from_hf_dict(LLAMA_31_8B)
    assert config.rope.rope_type == "llama3" and config.dtype == "bfloat16"
    assert 8.02e9 < config.num_params() < 8.04e9
    hf = LlamaRotaryEmbedding(LlamaConfig(**LLAMA_31_8B))
    torch.testing.assert_close(compute_inv_freq(config.rope, config.head_dim), hf.inv_freq)
