"""The messages between API server processes and EngineCore processes, and their encoding.

Every message is a ``msgspec.Struct`` encoded as MessagePack (compact arrays, no field names
on the wire). Each direction has one tagged union, so a receiver decodes any message of its
direction with one typed decoder and dispatches on the type:

* API server → EngineCore (``ClientMessage``): ``AddRequest``, ``AbortRequests``;
* EngineCore → API server (``EngineMessage``): ``EngineReady`` (the handshake, once per
  connection), ``EngineOutputs`` (one applied step's outputs for that API server's requests,
  with the scheduler's state attached to exactly one API server's message per step),
  ``EngineDead`` (the engine's loop failed; every request in flight is lost);
* with data parallelism, EngineCore → DP coordinator ``EngineLoad`` (its queue lengths and KV
  usage when they change) and DP coordinator → API servers ``LoadSnapshot`` (every engine's
  last load, for the router).

Times are seconds on the run's clock (``engine.entrypoints.clock``): every process of one
server reads the same monotonic clock with the same origin.
"""

from __future__ import annotations

from typing import Final

import msgspec

from engine.core.sampling_params import SamplingParams

#: ZMQ identity prefix of an EngineCore's DEALER sockets (followed by its index).
ENGINE_IDENTITY_PREFIX: Final = b"engine-"


def engine_identity(engine_index: int) -> bytes:
    return ENGINE_IDENTITY_PREFIX + str(engine_index).encode()


# -- API server -> EngineCore ---------------------------------------------------------------------
class AddRequest(msgspec.Struct, tag="add", array_like=True, frozen=True):
    """A validated, tokenized request for the engine's waiting queue."""

    req_id: str  # unique across the API servers of one server
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time_s: float  # when the API server received it
    client_index: int  # the API server that owns it (its outputs go there)
    priority: int = 0


class AbortRequests(msgspec.Struct, tag="abort", array_like=True, frozen=True):
    """Stop these requests and free their KV blocks (client gone, stop string matched)."""

    req_ids: list[str]


ClientMessage = AddRequest | AbortRequests


# -- EngineCore -> API server ---------------------------------------------------------------------
class EngineInfo(msgspec.Struct, array_like=True, frozen=True):
    """What an API server must know about the engine before it accepts requests."""

    max_model_len: int
    vocab_size: int  # token ids of a prompt must be below this
    num_gpu_blocks: int
    block_size: int
    device: str  # where the model runs ("cpu", "cuda:0", "emulated h100-sxm x4")


class EngineReady(msgspec.Struct, tag="ready", array_like=True, frozen=True):
    engine_index: int
    info: EngineInfo


class RequestTiming(msgspec.Struct, array_like=True, frozen=True):
    """Engine-side times of a finished request (NaN where it never got there)."""

    queued_s: float  # added to the waiting queue
    scheduled_s: float  # first admitted
    first_token_s: float  # first output token applied
    last_token_s: float  # last output token applied
    num_preemptions: int


class RequestUpdate(msgspec.Struct, array_like=True, frozen=True):
    """New tokens and/or the finish of one request after one step."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | str | None = None  # the stop token id, if one ended it
    timing: RequestTiming | None = None  # on the finishing output only
    error: str | None = None  # finish_reason "error": why the engine refused the request


class SchedulerStats(msgspec.Struct, array_like=True, frozen=True):
    """The engine's state after a step, and counter increments since the last stats sent."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 1 - free / usable KV blocks
    prefix_cache_queries: int  # tokens looked up in the prefix cache at admissions
    prefix_cache_hits: int  # of which found cached
    num_preemptions: int


class EngineOutputs(msgspec.Struct, tag="outputs", array_like=True, frozen=True):
    """One engine-loop iteration's news for one API server."""

    engine_index: int
    step_id: int  # the applied step that produced ``outputs`` (-1: none)
    time_s: float  # when the engine applied it (sent right after)
    outputs: list[RequestUpdate]
    stats: SchedulerStats | None = None


class EngineDead(msgspec.Struct, tag="dead", array_like=True, frozen=True):
    engine_index: int
    reason: str


class EngineLoad(msgspec.Struct, tag="load", array_like=True, frozen=True):
    """One EngineCore's load after a step (what a DP router weighs)."""

    engine_index: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 1 - free / usable KV blocks


class LoadSnapshot(msgspec.Struct, tag="snapshot", array_like=True, frozen=True):
    """Every EngineCore's last reported load (index = engine index), from the coordinator."""

    loads: list[EngineLoad]


EngineMessage = EngineReady | EngineOutputs | EngineDead | EngineLoad | LoadSnapshot


class Codec:
    """Encoder and the two typed decoders (one instance per process: they keep buffers)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._client: msgspec.msgpack.Decoder[ClientMessage] = msgspec.msgpack.Decoder(
            ClientMessage)
        self._engine: msgspec.msgpack.Decoder[EngineMessage] = msgspec.msgpack.Decoder(
            EngineMessage)

    def encode(self, message: ClientMessage | EngineMessage) -> bytes:
        return self._encoder.encode(message)

    def decode_client(self, data: bytes) -> ClientMessage:
        return self._client.decode(data)

    def decode_engine(self, data: bytes) -> EngineMessage:
        return self._engine.decode(data)
