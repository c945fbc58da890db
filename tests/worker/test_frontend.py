"""Tokenizer, chat template, incremental detokenization and stop strings (engine/serve)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.request import SamplingParams
from engine.llm import LLM
from engine.serve.frontend import (
    IncrementalDetokenizer,
    StopStringMatcher,
    Tokenizer,
    TokenizerError,
)
from workload.admission import PromptError, validate_prompt

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "  What is the capital of France?  "},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def test_frontend_does_not_import_torch() -> None:
    import subprocess

    code = "import engine.serve.frontend, engine.serve.output_processor, engine.serve.engine_loop;"
    code += "import sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_and_chat_template_match_transformers(
    arch: str, llama_dir: Path, qwen2_dir: Path
) -> None:
    from transformers import AutoTokenizer

    model_dir = llama_dir if arch == "llama" else qwen2_dir
    ours = Tokenizer.from_dir(model_dir)
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    text = "Hello world! The engine schedules requests, 42 times: é, 中文, 🙂."
    assert ours.encode(text) == hf(text).input_ids
    assert ours.decode(ours.encode(text)) == text
    for add in (True, False):
        rendered = ours.apply_chat_template(MESSAGES, add_generation_prompt=add)
        assert rendered == hf.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=add
        )
    assert ours.eos_token_id == hf.eos_token_id
    assert ours.vocab_size == 384


def test_bad_tokenizer_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="missing"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizer"):
        Tokenizer.from_dir(tmp_path)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(text=st.text(
    alphabet=st.sampled_from([*"abc XYZ!.,\n", "é", "中", "🙂", "ß", "—"]), max_size=40
))
def test_incremental_deltas_rebuild_the_text(text: str, llama_dir: Path) -> None:
    """Token by token (multi-byte characters split over byte tokens): deltas + flush == text."""
    tokenizer = Tokenizer.from_dir(llama_dir)
    prompt = tokenizer.encode("The engine")
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add_tokens([t]) for t in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == text == detok.text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_matcher() -> None:
    matcher = StopStringMatcher(["lo w", "xyz", ""])
    assert matcher.find("hel", 3) is None
    found = matcher.find("hello world", 8)
    assert found is not None and (found.stop, found.text_end) == ("lo w", 3)
    assert matcher.find("hello world", 1) is None  # "lo w" ended before the new text
    both = StopStringMatcher(["world", "lo"]).find("hello world", 11)
    assert both is not None and both.stop == "lo"  # the earliest occurrence wins


def test_validate_prompt() -> None:
    validate_prompt([1, 2, 3], vocab_size=10, max_model_len=3)
    with pytest.raises(PromptError, match="longer"):
        validate_prompt([1, 2, 3, 4], vocab_size=10, max_model_len=3)
    with pytest.raises(PromptError, match="vocabulary"):
        validate_prompt([1, -1], vocab_size=10, max_model_len=3)


@pytest.fixture(scope="module")
def llm(llama_dir: Path) -> LLM:
    return LLM(str(llama_dir), device="cpu", kv_cache_memory=1 << 22, block_size=4)


def test_stop_strings_cut_text_and_finish(llm: LLM) -> None:
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompt = "The quick brown fox"
    full = llm.generate(prompt, greedy)[0]
    clean = [i for i in range(4, len(full.text) - 2) if "\ufffd" not in full.text[i : i + 2]]
    assert clean, full.text
    stop = full.text[clean[0] : clean[0] + 2]
    cut = full.text.index(stop)
    out = llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                              stop=(stop, "never-appears")))[0]
    assert out.text == full.text[:cut]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.output_token_ids == full.output_token_ids[: len(out.output_token_ids)]
    assert len(out.output_token_ids) < len(full.output_token_ids)
    assert llm.core.scheduler.get_num_unfinished_requests() == 0  # the core was told (abort)


def test_eos_and_stop_tokens_and_min_tokens(llm: LLM) -> None:
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompt = [[5, 17, 99, 3, 250, 42]]
    full = llm.generate(prompt, greedy)[0].output_token_ids
    k = next(i for i in range(2, 16) if full[i] not in full[:i])  # first new token at i >= 2
    stop = SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=(full[k],))
    out = llm.generate(prompt, stop)[0]
    assert out.output_token_ids == full[: k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", full[k])
    banned = SamplingParams(max_tokens=16, temperature=0.0, min_tokens=k + 1,
                            stop_token_ids=(full[k],))
    longer = llm.generate(prompt, banned)[0]
    assert longer.output_token_ids[:k] == full[:k]
    assert full[k] not in longer.output_token_ids[: k + 1]
    # The model's EOS (from the tokenizer) ends a request unless ignore_eos.
    eos = llm.engine.eos_token_id
    assert eos is not None and llm.engine.extra_stop_token_ids  # <|eot_id|> from generation_config


def test_chat_generate(llm: LLM) -> None:
    out = llm.chat(MESSAGES[:2], SamplingParams(max_tokens=4, temperature=0.0))[0]
    tokenizer = llm.get_tokenizer()
    assert tokenizer is not None
    rendered = tokenizer.apply_chat_template(MESSAGES[:2])
    assert out.prompt == rendered
    assert out.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert out.prompt_token_ids[0] == tokenizer.bos_token_id  # from the template, not doubled
    assert out.prompt_token_ids[1] != tokenizer.bos_token_id
