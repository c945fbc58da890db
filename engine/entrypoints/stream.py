"""A request's output path inside an API server: text deltas, stop strings, and the hand-off.

``RequestText`` turns the token ids the engine sends into text (the incremental detokenizer of
``engine.serve.frontend``) and checks stop strings, releasing only text that can no longer be
part of a stop string: while a stop string may still complete, its possible beginning is held
back (``len(longest stop) - 1`` characters), so streamed text is never taken back.

``OutputStream`` hands a request's deltas from the output handler (which runs once per engine
message) to the coroutine answering the client. When that coroutine falls behind — a slow
client, a busy event loop — pending deltas merge into one instead of queueing, so a request
holds at most one pending delta however far its consumer lags (vLLM's
``RequestOutputCollector``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from engine.serve.frontend import IncrementalDetokenizer, StopStringMatcher, Tokenizer


@dataclass(slots=True)
class Delta:
    """What a request got since the client was last served."""

    text: str
    token_ids: list[int]
    step_ids: list[int]  # the engine steps the tokens came from, in order
    engine_index: int
    finish_reason: str | None = None  # set on the last delta
    stop_reason: int | str | None = None
    error: str | None = None  # the engine refused the request
    num_updates: int = 1  # engine messages merged into this delta

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def merge(self, later: Delta) -> None:
        """Append a later delta of the same request (self is still pending)."""
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        self.step_ids.extend(later.step_ids)
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason
        self.error = later.error
        self.num_updates += later.num_updates


class OutputStream:
    """One request's pending output: at most one merged ``Delta``, or the error that ended it."""

    def __init__(self) -> None:
        self._pending: Delta | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, delta: Delta) -> None:
        if self._pending is None:
            self._pending = delta
        else:
            self._pending.merge(delta)
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        """The request cannot go on (the engine died): ``get`` raises ``error``."""
        self._error = error
        self._ready.set()

    async def get(self) -> Delta:
        """The pending delta (waiting for one); raises the stream's error once failed."""
        while self._pending is None:
            if self._error is not None:
                raise self._error
            await self._ready.wait()
            self._ready.clear()
        delta, self._pending = self._pending, None
        return delta

    async def get_final(self) -> Delta:
        """Everything up to the request's end, as one delta (a non-streaming answer)."""
        while self._pending is None or not self._pending.finished:
            if self._error is not None:
                raise self._error
            await self._ready.wait()
            self._ready.clear()
        delta, self._pending = self._pending, None
        return delta


@dataclass(slots=True)
class RequestText:
    """The text side of one request's outputs (None tokenizer: no text)."""

    tokenizer: Tokenizer | None
    prompt_token_ids: list[int]
    params: SamplingParams
    skip_special_tokens: bool = True
    text: str = ""  # all text so far (cut before a matched stop string)
    num_output_tokens: int = 0
    _sent: int = 0  # characters of ``text`` released
    _detokenizer: IncrementalDetokenizer | None = field(default=None, init=False)
    _matcher: StopStringMatcher = field(init=False)
    _hold_back: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.tokenizer is not None:
            self._detokenizer = IncrementalDetokenizer(
                self.tokenizer, self.prompt_token_ids, self.skip_special_tokens
            )
        self._matcher = StopStringMatcher(self.params.stop)
        self._hold_back = max((len(s) for s in self._matcher.stop), default=1) - 1

    def add(self, token_ids: list[int], finished: bool) -> tuple[str, str | None]:
        """Tokens from the engine (``finished``: the engine ended the request); returns the
        text to release and the stop string that ended the request here, if one did."""
        self.num_output_tokens += len(token_ids)
        detok = self._detokenizer
        if detok is None:
            return "", None
        new = detok.add_tokens(token_ids)
        if finished:
            new += detok.flush()
        self.text += new
        stop: str | None = None
        if self.num_output_tokens > self.params.min_tokens:
            match = self._matcher.find(self.text, len(new))
            if match is not None:
                self.text = self.text[: match.text_end]
                stop = match.stop
        end = len(self.text) if finished or stop is not None else len(self.text) - self._hold_back
        if end <= self._sent:
            return "", stop
        released = self.text[self._sent : end]
        self._sent = end
        return released, stop
