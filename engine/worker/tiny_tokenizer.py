"""A small, real byte-level BPE tokenizer built locally (no download), for tiny test models.

Responsibility: write a ``tokenizer.json`` the ``tokenizers`` package (and ``transformers``) load
like any Hub tokenizer — byte-level pre-tokenizer and decoder, a BPE model whose merges are
learned here from a built-in English corpus, special tokens, and (for the Llama flavour) a
post-processor that prepends BOS — plus the ``tokenizer_config.json`` with its chat template.

Deterministic: the merges come from a plain-Python BPE learner with a total tie-break order
(count, then the pair's strings), so the same ``vocab_size`` always gives the same file.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_CORPUS = """
The engine schedules requests step by step. Each step computes a batch of tokens: new prompts
are prefilled in chunks, running requests decode one token at a time, and the scheduler keeps the
key-value cache in fixed-size blocks. When the cache runs out of blocks, the most recent request
is preempted and will be recomputed later. Requests that share a prefix can reuse cached blocks,
which saves time and memory. The model is a decoder with attention, a feed-forward network and
normalization in every layer. A small model is useful for tests: it loads quickly, runs on any
machine and gives the same answer every time. Hello world! How are you today? I am fine, thank
you. What is the capital of France? The capital of France is Paris. Tell me a story about a cat
and a dog who became friends in the city. Once upon a time there was a little cat who lived near
the river. Numbers such as 1, 2, 3, 10, 42 and 2024 appear in text too, with punctuation: (a),
[b], {c}; "quotes" and 'apostrophes' - dashes... and new lines.
The quick brown fox jumps over the lazy dog. Serving large language models efficiently needs
careful batching, memory management and fast kernels on the accelerator.
"""

#: Special tokens (first ids) and chat-template pieces of each flavour.
_FLAVOURS: dict[str, dict[str, object]] = {
    "llama": {
        "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                     "<|end_header_id|>", "<|eot_id|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
        "chat_template": (
            "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
            "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{% endif %}"
        ),
    },
    "qwen2": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "chat_template": (
            "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{{ message['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    },
}


@dataclass(frozen=True, slots=True)
class TinyTokenizerInfo:
    """What the model files need to know about the written tokenizer."""

    vocab_size: int  # ids in tokenizer.json (== the model's vocab_size)
    bos_token_id: int | None  # None when the flavour adds no BOS
    eos_token_id: int  # end of sequence
    extra_eos_token_ids: tuple[int, ...]  # other ids that end a turn (generation_config)


def _learn_merges(words: Counter[tuple[str, ...]], num_merges: int) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    words = Counter(words)
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def build_tokenizer_files(out_dir: Path, flavour: str, vocab_size: int) -> TinyTokenizerInfo:
    """Write ``tokenizer.json`` + ``tokenizer_config.json``; returns the special token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    spec = _FLAVOURS[flavour]
    specials = list(spec["specials"])  # type: ignore[call-overload]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    base = len(specials) + len(alphabet)
    if vocab_size < base + 1:
        raise ValueError(f"vocab_size must be at least {base + 1} for a byte-level tokenizer")
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = Counter(tuple(w) for w, _ in pre.pre_tokenize_str(_CORPUS))
    merges = _learn_merges(words, vocab_size - base)
    if len(merges) < vocab_size - base:
        raise ValueError(f"the built-in corpus supports vocab_size <= {base + len(merges)}")
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    # Distinct merges can yield the same string; pad with unreachable filler tokens if so.
    while len(vocab) < vocab_size:
        vocab[f"<|reserved_{len(vocab)}|>"] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    bos = spec["bos"]
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    eos = str(spec["eos"])
    extra = [t for t in ("<|eot_id|>", "<|endoftext|>") if t in vocab and t != eos]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": None,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
        "chat_template": spec["chat_template"],
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return TinyTokenizerInfo(
        vocab_size=vocab_size,
        bos_token_id=None if bos is None else vocab[str(bos)],
        eos_token_id=vocab[eos],
        extra_eos_token_ids=tuple(vocab[t] for t in extra),
    )
