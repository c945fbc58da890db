"""The front end's text side: tokenizer, chat template, incremental detokenizer, stop strings.

Responsibility: everything between text and token ids, on both ends of a request, with no torch:

* ``Tokenizer`` — a checkpoint's ``tokenizer.json`` (the ``tokenizers`` package) and
  ``tokenizer_config.json`` (special tokens, ``chat_template`` rendered with a sandboxed jinja2
  environment configured as ``transformers`` does: ``trim_blocks``, ``lstrip_blocks``);
* ``IncrementalDetokenizer`` — new text per new token, by decoding a short window of ids and
  emitting only what is stable (nothing that ends in an incomplete UTF-8 character);
* ``StopStringMatcher`` — finds the first stop string in the generated text; the text is cut
  before it (vLLM's default ``include_stop_str_in_output=False``) and the request finishes with
  reason ``stop`` and ``stop_reason`` = the string (the engine core is then told to abort it).

``tokenizers`` and ``jinja2`` are imported only when a tokenizer is loaded or a template rendered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import UserError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
#: Prompt ids kept as left context when detokenizing the first output tokens (vLLM: 5).
INITIAL_CONTEXT_TOKENS = 5


class TokenizerError(UserError):
    """A tokenizer file is missing or malformed, or a chat template cannot be rendered."""


def _token_text(value: Any) -> str | None:
    """Special tokens are strings or AddedToken dicts (``{"content": ...}``) in configs."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise TokenizerError(f"{path} must hold a JSON object")
    return raw


def _pick_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode, special ids, chat template."""

    def __init__(self, backend: Any, config: dict[str, Any], chat_template: str | None) -> None:
        self.backend = backend  # a tokenizers.Tokenizer
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.chat_template = chat_template
        self._compiled_template: Any = None  # compiled on first use (a server renders often)
        self.eos_token_id = None if self.eos_token is None else backend.token_to_id(self.eos_token)
        self.bos_token_id = None if self.bos_token is None else backend.token_to_id(self.bos_token)

    @staticmethod
    def has_tokenizer(model_dir: str | Path) -> bool:
        return (Path(model_dir) / TOKENIZER_FILE).is_file()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``chat_template.jinja``)."""
        root = Path(model_dir)
        file = root / TOKENIZER_FILE
        if not file.is_file():
            raise TokenizerError(
                f"{file} is missing (only tokenizer.json tokenizers are supported)"
            )
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TokenizerError("loading a tokenizer needs the 'tokenizers' package") from exc
        try:
            backend = HFTokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(f"{file} is not a valid tokenizer: {exc}") from None
        config_file = root / TOKENIZER_CONFIG_FILE
        config = _read_json(config_file) if config_file.is_file() else {}
        template = _pick_template(config.get("chat_template"))
        jinja_file = root / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        return cls(backend, config, template)

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render the conversation as text (encode it with ``add_special_tokens=False``)."""
        if self.chat_template is None:
            raise TokenizerError("this tokenizer has no chat_template in tokenizer_config.json")
        from jinja2 import TemplateError

        try:
            if self._compiled_template is None:
                from jinja2.sandbox import ImmutableSandboxedEnvironment

                def raise_exception(message: str) -> None:
                    raise TemplateError(message)

                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent)
                env.globals["raise_exception"] = raise_exception
                self._compiled_template = env.from_string(self.chat_template)
            return str(self._compiled_template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            ))
        except TemplateError as exc:
            raise TokenizerError(f"chat template failed: {exc}") from None


def generation_eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """``eos_token_id`` of ``generation_config.json`` (an int or a list), or ``()``."""
    file = Path(model_dir) / GENERATION_CONFIG_FILE
    if not file.is_file():
        return ()
    value = _read_json(file).get("eos_token_id")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))
    return ()


class IncrementalDetokenizer:
    """Text of a request's output tokens, one stable delta at a time.

    Invariant: ``text`` is the decode of the output ids in the context of the last prompt ids,
    minus any trailing incomplete character, which ``flush`` releases at the end.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids = list(prompt_token_ids[-INITIAL_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, new_token_ids: Sequence[int]) -> str:
        """Append tokens; returns the newly stable text (may be empty)."""
        self.token_ids.extend(new_token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of a request: release text held back (an incomplete character)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta


@dataclass(frozen=True, slots=True)
class StopMatch:
    """Where a stop string was found in a request's text."""

    stop: str  # the stop string (the request's stop_reason)
    text_end: int  # the text is cut here (the stop string is excluded)


class StopStringMatcher:
    """First occurrence of any stop string in the text, checking only where new text can match."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(s for s in stop if s)

    def find(self, text: str, num_new_chars: int) -> StopMatch | None:
        """The earliest stop string that ends inside the last ``num_new_chars`` characters."""
        if not self.stop or num_new_chars <= 0:
            return None
        best: StopMatch | None = None
        for stop in self.stop:
            start = max(0, len(text) - num_new_chars - len(stop) + 1)
            index = text.find(stop, start)
            if index >= 0 and (best is None or index < best.text_end):
                best = StopMatch(stop, index)
        return best
