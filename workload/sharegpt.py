"""ShareGPT-format conversation files: vllm bench serve's ``sharegpt`` dataset.

A JSON list of entries ``{"conversations": [{"from": …, "value": text}, …]}``; entries with
fewer than two turns are dropped, the rest shuffled with ``random.Random(seed)`` (the order
``random.seed(seed); random.shuffle`` gives in vllm bench). Each entry's first turn is the prompt,
its second the completion whose token count is the output length (or ``output_len`` when given).
Both are counted with the tokenizer as ``tokenizer(text).input_ids`` counts them (special tokens
added). Entries are taken in order while fewer than ``num_prompts`` are kept, skipping those
vllm's ``is_valid_sequence`` rejects (prompt or output under 4 tokens — the output check is
skipped when ``output_len`` is given —, a prompt over 1024 tokens, both over 2048); when the
file holds too few, kept entries are drawn again with ``random.Random(seed).choice`` until there
are ``num_prompts`` (vllm's oversampling).

The prompt texts are kept: a served run sends them as text, as vllm bench does, while a
simulated run needs only their lengths. The ``tokenizers`` package is imported only here, when
such a file is read.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workload.errors import WorkloadError

#: vllm's ``is_valid_sequence`` limits.
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True, slots=True)
class ShareGPTRows:
    """The sampled conversations, in send order."""

    prompts: list[str]
    prompt_lens: np.ndarray  # int64, tokens incl. special tokens
    output_lens: np.ndarray  # int64


def is_valid_sequence(prompt_len: int, output_len: int, skip_min_output_len_check: bool) -> bool:
    """vllm bench's filter of sampled conversations."""
    return not (
        prompt_len < MIN_LEN
        or (not skip_min_output_len_check and output_len < MIN_LEN)
        or prompt_len > MAX_PROMPT_LEN
        or prompt_len + output_len > MAX_TOTAL_LEN
    )


def _encoder(tokenizer_dir: str) -> object:
    file = Path(tokenizer_dir) / TOKENIZER_FILE
    if not file.is_file():
        raise WorkloadError(
            f"the sharegpt dataset counts tokens with a tokenizer: {file} is missing "
            "(give --tokenizer DIR, a directory holding tokenizer.json)"
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise WorkloadError(
            "the sharegpt dataset needs the 'tokenizers' package (pip install '.[serve]')"
        ) from None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise WorkloadError(f"{file} is not a valid tokenizer: {exc}") from None


def _turns(path: Path) -> list[tuple[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkloadError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{path} is not a ShareGPT JSON file: {exc}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: a ShareGPT file holds a JSON list of conversations")
    out = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        try:
            prompt, completion = turns[0]["value"], turns[1]["value"]
        except (KeyError, TypeError):
            raise WorkloadError(
                f"{path}: conversation {i} has turns without a 'value'"
            ) from None
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise WorkloadError(f"{path}: conversation {i} has a turn whose value is no text")
        out.append((prompt, completion))
    return out


def load_sharegpt(path: str, tokenizer_dir: str, num_prompts: int, seed: int,
                  output_len: int | None = None) -> ShareGPTRows:
    """``num_prompts`` conversations of a ShareGPT file (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"ShareGPT file {path!r} not found")
    encoder = _encoder(tokenizer_dir)
    turns = _turns(p)
    random.Random(seed).shuffle(turns)
    prompts: list[str] = []
    prompt_lens: list[int] = []
    output_lens: list[int] = []
    for prompt, completion in turns:
        if len(prompts) >= num_prompts:
            break
        n_prompt = len(encoder.encode(prompt).ids)  # type: ignore[attr-defined]
        n_out = (len(encoder.encode(completion).ids)  # type: ignore[attr-defined]
                 if output_len is None else output_len)
        if not is_valid_sequence(n_prompt, n_out, output_len is not None):
            continue
        prompts.append(prompt)
        prompt_lens.append(n_prompt)
        output_lens.append(n_out)
    if not prompts:
        raise WorkloadError(
            f"{path}: no conversation has a prompt of {MIN_LEN}..{MAX_PROMPT_LEN} tokens and an "
            f"output of at least {MIN_LEN} (both at most {MAX_TOTAL_LEN})"
        )
    if len(prompts) < num_prompts:
        rng = random.Random(seed)
        kept = list(range(len(prompts)))
        for _ in range(num_prompts - len(kept)):
            j = rng.choice(kept)
            prompts.append(prompts[j])
            prompt_lens.append(prompt_lens[j])
            output_lens.append(output_lens[j])
    return ShareGPTRows(prompts, np.array(prompt_lens, dtype=np.int64),
                        np.array(output_lens, dtype=np.int64))
