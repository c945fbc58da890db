"""The OpenAI-compatible wire formats: pydantic request models, msgspec response records.

Requests are validated by pydantic (FastAPI parses bodies with these models). Unknown fields
are accepted and ignored, as vLLM does, because load generators send fields of their own
(``vllm bench serve`` sends ``repetition_penalty`` and ``logprobs: null``); fields that would
change the result but that twinserve does not implement are refused by ``unsupported`` with a
400 naming the field.

Responses are ``msgspec`` structs (fast JSON encoding for every streamed chunk), in the shapes
the OpenAI SDK and vLLM's clients parse: a completion chunk carries ``choices[0].text``, a chat
chunk ``choices[0].delta.content``; with ``stream_options.include_usage`` a last chunk has
``"choices": []`` and the ``usage``; the stream ends with ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class SamplingFields(OpenAIModel):
    """Fields both generation endpoints share (OpenAI's and vLLM's extra ones)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    n: int | None = 1
    best_of: int | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    priority: int = 0
    user: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True


class TextPart(OpenAIModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIModel):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI; max_completion_tokens wins
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False


class TokenizeRequest(OpenAIModel):
    """``POST /tokenize``: a completion prompt, or chat messages through the template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


# -- responses ------------------------------------------------------------------------------------
class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: int = 400


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


class UsageInfo(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: None = None


class CompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    object: Literal["text_completion"] = "text_completion"


class AssistantMessage(msgspec.Struct):
    content: str
    role: Literal["assistant"] = "assistant"


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    object: Literal["chat.completion"] = "chat.completion"


class DeltaMessage(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatStreamChoice(msgspec.Struct):
    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class CompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    object: Literal["text_completion"] = "text_completion"


class ModelCard(msgspec.Struct):
    id: str
    created: int
    root: str
    max_model_len: int
    object: Literal["model"] = "model"
    owned_by: str = "twinserve"
    parent: str | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct):
    prompt: str


# -- what twinserve does not implement ------------------------------------------------------------
def unsupported(request: CompletionRequest | ChatCompletionRequest) -> tuple[str, str] | None:
    """(field, why) for the first field that asks for something twinserve does not do."""
    checks: list[tuple[str, bool, str]] = [
        ("n", (request.n or 1) != 1, "only n=1 is supported"),
        ("best_of", (request.best_of or 1) != 1, "only best_of=1 is supported"),
        ("frequency_penalty", bool(request.frequency_penalty), "penalties are not supported"),
        ("presence_penalty", bool(request.presence_penalty), "penalties are not supported"),
        ("repetition_penalty", request.repetition_penalty not in (None, 1.0),
         "penalties are not supported"),
        ("logit_bias", bool(request.logit_bias), "logit_bias is not supported"),
        ("min_p", bool(request.min_p), "min_p is not supported"),
        ("include_stop_str_in_output", request.include_stop_str_in_output,
         "stop strings are always cut from the output"),
        ("echo", bool(request.echo), "echo is not supported"),
    ]
    if isinstance(request, CompletionRequest):
        checks += [
            ("logprobs", request.logprobs is not None, "logprobs are not supported"),
            ("suffix", bool(request.suffix), "suffix is not supported"),
        ]
    else:
        response_type = (request.response_format or {}).get("type", "text")
        checks += [
            ("logprobs", bool(request.logprobs) or request.top_logprobs is not None,
             "logprobs are not supported"),
            ("tools", bool(request.tools), "tools are not supported"),
            ("response_format", response_type != "text", "only text responses are supported"),
            ("continue_final_message", request.continue_final_message,
             "continue_final_message is not supported"),
        ]
    if request.stream_options is not None and not request.stream:
        return "stream_options", "stream_options can only be given when stream is true"
    for name, refused, why in checks:
        if refused:
            return name, why
    return None
