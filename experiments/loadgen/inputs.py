"""The requests a benchmark sends: a workload's stream with the prompts a server takes.

``bench_requests`` turns a ``workload.stream.Workload`` — the very stream ``twinserve simulate``
builds from the same flags — into ``BenchRequest``s: send time, prompt, prompt length, output
length and a request id. Prompts are

* token ids for the synthetic datasets (``random``, ``prefix_repetition``, traces): seeded
  random tokens with the workload's lengths and shared prefixes (``workload.prompts``), so the
  server computes exactly the prompt lengths the simulator assumes, and prefix caching sees the
  prefixes the simulator's block hashes stand for;
* the conversation's text for ``sharegpt`` (as vllm bench sends it; the tokenizer that counted
  it should be the server's);
* text for a chat endpoint (``messages`` carry no token ids): a synthetic prompt is decoded
  with the tokenizer, whose re-tokenization on the server may differ by a few tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.errors import UserError
from workload.prompts import synthetic_prompts
from workload.stream import Workload

#: Vocabulary of synthetic prompts when no tokenizer says otherwise (ids even toy models have).
DEFAULT_PROMPT_VOCAB = 256


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a benchmark, in send order."""

    index: int  # position in the stream (the workload's row)
    request_id: str  # sent as X-Request-Id (the server keeps it beside its own id)
    prompt: list[int] | str  # token ids or text
    prompt_len: int  # the workload's prompt tokens (the server's count replaces it when known)
    output_len: int  # max_tokens
    send_time_s: float  # offset from the benchmark's start


def prompts_of(workload: Workload, *, vocab_size: int, token_seed: int, as_text: bool,
               tokenizer: object | None) -> list[list[int]] | list[str]:
    """The prompts to send (see the module docstring). ``token_seed`` seeds the synthetic
    tokens (independent of the workload's seed: two runs of one stream with different token
    seeds never share a prefix-cache entry)."""
    texts = workload.extra.get("prompt_texts")
    if isinstance(texts, list):
        return [str(t) for t in texts]
    ids = synthetic_prompts(workload, vocab_size, token_seed)
    if not as_text:
        return ids
    if tokenizer is None:
        raise UserError("a chat endpoint takes text: give --tokenizer DIR so that the "
                        "synthetic prompts can be turned into text")
    decode = tokenizer.decode  # type: ignore[attr-defined]
    return [str(decode(p)) for p in ids]


def bench_requests(workload: Workload, prompts: Sequence[list[int] | str],
                   request_id_prefix: str) -> list[BenchRequest]:
    """One ``BenchRequest`` per row of ``workload`` (ids ``prefix0``, ``prefix1`` …)."""
    if len(prompts) != len(workload):
        raise ValueError("one prompt per request")
    return [
        BenchRequest(i, f"{request_id_prefix}{i}", prompts[i], int(workload.prompt_lens[i]),
                     int(workload.output_lens[i]), float(workload.send_time_s[i]))
        for i in range(len(workload))
    ]
