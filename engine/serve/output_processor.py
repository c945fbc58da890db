"""The output path: engine-core outputs → per-request text, stop strings, final results.

Responsibility (vLLM V1's ``OutputProcessor``, offline flavour): keep one ``RequestOutput`` per
live request, append the token ids each ``EngineCoreOutput`` brings, detokenize incrementally,
and finish a request when the core says so or when a stop string appears in its text. A stop
string finishes the request *here*: its id is returned in ``reqs_to_abort`` so the driver tells
the engine core (``EngineCore.abort_requests``), exactly as vLLM's front end does.

Invariant: a finished request's ``output_token_ids`` are exactly the tokens the core emitted for
it (up to and including the one that completed a stop string); ``text`` is their detokenization,
cut before the stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.outputs import EngineCoreOutput
from engine.core.request import SamplingParams
from engine.serve.frontend import IncrementalDetokenizer, StopStringMatcher, Tokenizer
from workload.admission import PromptError


@dataclass(slots=True)
class RequestOutput:
    """A request's result so far (final once ``finished``)."""

    req_id: str
    prompt: str | None  # the text prompt, if one was given
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""  # detokenized output ("" without a tokenizer)
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length", "abort", …
    stop_reason: int | str | None = None  # the stop token id or stop string, if one ended it

    def to_json(self) -> dict[str, object]:
        """The ``twinserve generate --json`` record."""
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "output_token_ids": self.output_token_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class _Tracked:
    output: RequestOutput
    detokenizer: IncrementalDetokenizer | None
    matcher: StopStringMatcher


@dataclass(frozen=True, slots=True)
class ProcessedOutputs:
    """What one batch of engine-core outputs produced."""

    finished: list[RequestOutput]  # requests that ended in this batch
    reqs_to_abort: list[str]  # ended by a stop string: the core must abort them


class OutputProcessor:
    """Per-request output state, fed by ``EngineCoreOutput`` batches in step order."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._requests: dict[str, _Tracked] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def add_request(
        self,
        req_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> None:
        if params.stop and self.tokenizer is None:
            raise PromptError(
                "stop strings need a tokenizer (the checkpoint has no tokenizer.json)"
            )
        detok = (
            IncrementalDetokenizer(self.tokenizer, prompt_token_ids)
            if self.tokenizer is not None else None
        )
        output = RequestOutput(req_id, prompt, list(prompt_token_ids))
        self._requests[req_id] = _Tracked(output, detok, StopStringMatcher(params.stop))

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        finished: list[RequestOutput] = []
        to_abort: list[str] = []
        for core_out in outputs:
            tracked = self._requests.get(core_out.req_id)
            if tracked is None:
                continue  # already finished here (stop string) while the core was in flight
            if self._apply(tracked, core_out):
                to_abort.append(core_out.req_id)
            if tracked.output.finished:
                finished.append(tracked.output)
                del self._requests[core_out.req_id]
        return ProcessedOutputs(finished, to_abort)

    def _apply(self, tracked: _Tracked, core_out: EngineCoreOutput) -> bool:
        """Apply one output; True if a stop string ended a request the core still runs."""
        out = tracked.output
        out.output_token_ids.extend(core_out.new_token_ids)
        if core_out.finish_reason is not None:
            out.finished = True
            out.finish_reason = str(core_out.finish_reason)
            out.stop_reason = core_out.stop_reason
        detok = tracked.detokenizer
        if detok is None:
            return False
        delta = detok.add_tokens(core_out.new_token_ids)
        if out.finished:
            delta += detok.flush()
        out.text += delta
        match = tracked.matcher.find(out.text, len(delta))
        if match is None:
            return False
        out.text = out.text[: match.text_end]
        was_running = not out.finished
        out.finished = True
        out.finish_reason = "stop"
        out.stop_reason = match.stop
        return was_running
