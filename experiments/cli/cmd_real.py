"""Subcommands of the real world: ``generate`` and ``make-tiny-model``.

Both are thin layers over library calls (``engine.llm.LLM``, ``engine.worker.tiny_model``);
torch and the worker are imported inside the command functions so ``twinserve --help`` stays
fast. Engine flags are the fields of ``engine.llm.EngineArgs`` (``experiments.cli.flags``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.core.config import ConfigError
from experiments.cli.flags import add_engine_flags, engine_args_from_flags


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,3, got {text!r}"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-token-ids needs at least one id")
    return ids


def _generate(args: argparse.Namespace) -> int:
    from engine.core.request import SamplingParams
    from engine.llm import LLM

    prompts: list[Any] = list(args.prompt or []) + list(args.prompt_token_ids or [])
    if not prompts:
        raise ConfigError("give at least one --prompt TEXT or --prompt-token-ids 1,2,3")
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens, min_tokens=args.min_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
            stop=tuple(args.stop or ()), ignore_eos=args.ignore_eos,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    texts = [p for p in prompts if isinstance(p, str)]
    if args.chat and len(texts) != len(prompts):
        raise ConfigError("--chat takes --prompt TEXT only")
    llm = LLM.from_engine_args(engine_args_from_flags(args))
    try:
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": t}] for t in texts], params)
        else:
            outputs = llm.generate(prompts, params)
    finally:
        llm.shutdown()  # stops the worker processes of a TP/PP layout
    for out in outputs:
        if args.json:
            sys.stdout.write(json.dumps(out.to_json()) + "\n")
        elif llm.get_tokenizer() is not None:
            sys.stdout.write(out.text + "\n")
        else:
            sys.stdout.write(" ".join(map(str, out.output_token_ids)) + "\n")
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from engine.worker.tiny_model import TinyModelSpec, make_tiny_model

    spec = TinyModelSpec(
        arch=args.arch, vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
        head_dim=args.head_dim, max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=args.tie_word_embeddings, dtype=args.dtype,
        num_shards=args.num_shards, seed=args.seed,
    )
    try:
        out = make_tiny_model(args.dir, spec)
    except ValueError as exc:  # e.g. a vocabulary the built-in corpus cannot fill
        raise ConfigError(str(exc)) from None
    print(out)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with a local checkpoint (offline LLM.generate)",
        description="Run prompts through the real engine (EngineCore + torch worker) and print "
        "the generated text, or one JSON object per prompt with --json.",
    )
    add_engine_flags(p, parallel=True)
    src = p.add_argument_group("prompts (repeatable, in order: texts, then token-id lists)")
    src.add_argument("--prompt", action="append", help="a text prompt")
    src.add_argument("--prompt-token-ids", action="append", type=_token_ids,
                     help="a prompt as comma-separated token ids")
    src.add_argument("--chat", action="store_true", help="apply the chat template to --prompt")
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=16)
    s.add_argument("--min-tokens", type=int, default=0)
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, help="per-request sampling seed")
    s.add_argument("--stop", action="append", help="a stop string (repeatable)")
    s.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per prompt: prompt_token_ids, output_token_ids, text, "
                   "finish_reason")
    p.set_defaults(func=_generate)

    t = sub.add_parser(
        "make-tiny-model",
        help="write a small random Llama/Qwen2 checkpoint + tokenizer (HF format)",
        description="Write a deterministic random checkpoint (config.json, safetensors, "
        "tokenizer.json, tokenizer_config.json with a chat template) for demos and tests.",
    )
    t.add_argument("dir", help="output directory")
    t.add_argument("--arch", choices=["llama", "qwen2"], default="llama",
                   help="qwen2: QKV bias and tied embeddings")
    t.add_argument("--vocab-size", type=int, default=384)
    t.add_argument("--hidden-size", type=int, default=64)
    t.add_argument("--intermediate-size", type=int, default=128)
    t.add_argument("--num-layers", type=int, default=2)
    t.add_argument("--num-heads", type=int, default=4)
    t.add_argument("--num-kv-heads", type=int, default=2)
    t.add_argument("--head-dim", type=int)
    t.add_argument("--max-position-embeddings", type=int, default=1024)
    tie = t.add_mutually_exclusive_group()
    tie.add_argument("--tie-word-embeddings", dest="tie_word_embeddings", action="store_true",
                     default=None)
    tie.add_argument("--untie-word-embeddings", dest="tie_word_embeddings",
                     action="store_false")
    t.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    t.add_argument("--num-shards", type=int, default=1, help="> 1 writes an index + shards")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_make_tiny_model)
