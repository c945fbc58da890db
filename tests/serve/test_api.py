"""The OpenAI-compatible API of a real ``twinserve serve`` process tree, through the openai SDK.

One tiny-model server serves the whole module (``tiny_server``). Each test leaves it idle.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from experiments.cli import main as twinserve
from tests.serve.metrics import families, scrape
from tests.serve.server import ServerProcess, wait_for

PROMPTS = ["Hello world", "The capital of France is", "Once upon a time there was"]
GREEDY = {"temperature": 0.0, "max_tokens": 12}


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def generate(capsys: pytest.CaptureFixture[str], tiny_model: Path, *args: str) -> list[str]:
    """``twinserve generate --json`` texts, one per prompt."""
    capsys.readouterr()
    code = twinserve(["generate", "--model", str(tiny_model), "--kv-cache-memory", "4MiB",
                      "--max-tokens", "12", "--json", *args])
    assert code == 0
    return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]


def test_greedy_completions_equal_twinserve_generate(
    tiny_server: ServerProcess, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = client(tiny_server)
    served = [c.completions.create(model=str(tiny_model), prompt=p, **GREEDY).choices[0].text
              for p in PROMPTS]
    ids = [7, 8, 9, 10, 11]
    served.append(c.completions.create(model=str(tiny_model), prompt=ids, **GREEDY)
                  .choices[0].text)
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    expected = generate(capsys, tiny_model, *args, "--prompt-token-ids", "7,8,9,10,11")
    assert served == expected
    assert all(served)


def test_greedy_chat_equals_twinserve_generate_chat(
    tiny_server: ServerProcess, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = client(tiny_server)
    served = []
    for p in PROMPTS:
        r = c.chat.completions.create(model=str(tiny_model), temperature=0.0,
                                      max_completion_tokens=12,
                                      messages=[{"role": "user", "content": p}])
        assert r.choices[0].message.role == "assistant"
        served.append(r.choices[0].message.content)
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    assert served == generate(capsys, tiny_model, "--chat", *args)


def test_chat_content_parts_as_vllm_bench_sends_them(
    tiny_server: ServerProcess, tiny_model: Path
) -> None:
    """vllm bench's chat client sends ``content: [{"type": "text", "text": ...}]`` and
    ``max_completion_tokens``: the same answer as plain string content."""
    answers = []
    for content in ("Hello there", [{"type": "text", "text": "Hello there"}]):
        body = {"model": str(tiny_model), "messages": [{"role": "user", "content": content}],
                "max_completion_tokens": 8, "temperature": 0.0}
        reply = tiny_server.request("POST", "/v1/chat/completions", body)
        assert reply.status == 200, reply.body
        answers.append(reply.json()["choices"][0]["message"]["content"])
    assert answers[0] == answers[1] and answers[0]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_concatenated_stream_equals_non_streamed(
    tiny_server: ServerProcess, tiny_model: Path, endpoint: str
) -> None:
    c = client(tiny_server)
    for prompt in PROMPTS:
        kwargs: dict[str, Any] = {"model": str(tiny_model), "temperature": 0.0}
        if endpoint == "chat":
            create: Any = c.chat.completions.create
            kwargs |= {"messages": [{"role": "user", "content": prompt}],
                       "max_completion_tokens": 20}
        else:
            create = c.completions.create
            kwargs |= {"prompt": prompt, "max_tokens": 20}
        full = create(**kwargs)
        chunks = list(create(stream=True, stream_options={"include_usage": True}, **kwargs))
        text_chunks = [ch for ch in chunks if ch.choices]
        assert chunks[-1].choices == [] and chunks[-1].usage == full.usage
        if endpoint == "chat":
            assert text_chunks[0].choices[0].delta.role == "assistant"
            streamed = "".join(ch.choices[0].delta.content or "" for ch in text_chunks)
            expected = full.choices[0].message.content
        else:
            streamed = "".join(ch.choices[0].text for ch in text_chunks)
            expected = full.choices[0].text
        assert streamed == expected
        assert text_chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
        assert all(ch.choices[0].finish_reason is None for ch in text_chunks[:-1])


def test_sse_wire_format_is_what_load_generators_parse(
    tiny_server: ServerProcess, tiny_model: Path
) -> None:
    """The raw stream: ``data: {json}`` events separated by blank lines, every token chunk has
    ``choices[0].text``, the usage chunk has ``"choices": []``, the last line ``data: [DONE]``
    (what vllm bench serve's client reads)."""
    body = {"model": str(tiny_model), "prompt": "Hello", "max_tokens": 6, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True},
            "repetition_penalty": 1.0, "logprobs": None}
    reply = tiny_server.request("POST", "/v1/completions", body)
    assert reply.status == 200
    assert reply.content_type.startswith("text/event-stream")
    events = reply.body.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    *tokens, usage = payloads
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens"] == len(tokenize(tiny_server, "Hello"))
    assert all(p["object"] == "text_completion" and "text" in p["choices"][0] for p in tokens)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"


def tokenize(server: ServerProcess, prompt: str) -> list[int]:
    reply = server.request("POST", "/tokenize", {"prompt": prompt})
    assert reply.status == 200, reply.body
    return list(reply.json()["tokens"])


def test_sampling_parameters(tiny_server: ServerProcess, tiny_model: Path) -> None:
    c = client(tiny_server)
    m = str(tiny_model)
    seeded = [c.completions.create(model=m, prompt="Hello", max_tokens=10, temperature=0.9,
                                   top_p=0.9, seed=7, extra_body={"top_k": 50}).choices[0].text
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    long = c.completions.create(model=m, prompt="Hello", max_tokens=30, temperature=0.0,
                                extra_body={"ignore_eos": True, "min_tokens": 30})
    assert long.usage.completion_tokens == 30 and long.choices[0].finish_reason == "length"
    text = long.choices[0].text
    stop = text[8:11]
    cut = text.index(stop)
    for stream in (False, True):
        r = c.completions.create(model=m, prompt="Hello", max_tokens=30, temperature=0.0,
                                 stop=[stop], stream=stream, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(r)
            got = "".join(ch.choices[0].text for ch in chunks)
            last = chunks[-1].choices[0]
        else:
            got, last = r.choices[0].text, r.choices[0]
        assert got == text[:cut]
        assert last.finish_reason == "stop"
        assert last.model_extra is not None and last.model_extra["stop_reason"] == stop


def test_64_concurrent_streams_complete_while_the_rest_queue(
    tiny_server: ServerProcess, tiny_model: Path
) -> None:
    """64 streaming clients against max_num_seqs=8: the overflow waits in the engine's queue
    (seen in /metrics) and every stream completes."""
    before = scrape(tiny_server)
    most_waiting = 0.0
    done = threading.Event()

    def watch() -> None:
        nonlocal most_waiting
        while not done.is_set():
            most_waiting = max(most_waiting, scrape(tiny_server)["vllm:num_requests_waiting"])

    watcher = threading.Thread(target=watch)
    watcher.start()

    async def one(ac: openai.AsyncOpenAI, i: int) -> tuple[int, int, str | None]:
        stream = await ac.completions.create(
            model=str(tiny_model), prompt=[20 + i, 21, 22, 23], max_tokens=16, stream=True,
            temperature=0.0, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        chunks = [ch async for ch in stream]
        usage = chunks[-1].usage
        assert usage is not None
        return len(chunks) - 1, usage.completion_tokens, chunks[-2].choices[0].finish_reason

    async def run() -> list[tuple[int, int, str | None]]:
        async with openai.AsyncOpenAI(base_url=tiny_server.base_url, api_key="x",
                                      max_retries=0, timeout=120) as ac:
            return await asyncio.gather(*(one(ac, i) for i in range(64)))

    try:
        results = asyncio.run(run())
    finally:
        done.set()
        watcher.join()
    assert len(results) == 64
    assert all(n_tokens == 16 and reason == "length" and 1 <= n_chunks <= 16
               for n_chunks, n_tokens, reason in results)
    assert most_waiting > 0
    after = scrape(tiny_server)
    key = 'vllm:request_success_total{finished_reason="length"}'
    assert after[key] - before.get(key, 0.0) == 64
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 1024
    assert after["vllm:num_requests_running"] == 0


def test_metrics_parse_with_vllm_names(tiny_server: ServerProcess, tiny_model: Path) -> None:
    client(tiny_server).completions.create(model=str(tiny_model), prompt="Hi", max_tokens=4)
    reply = tiny_server.request("GET", "/metrics")
    assert reply.content_type.startswith("text/plain")
    found = families(tiny_server)
    expected = {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter", "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter", "vllm:num_preemptions": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
        "vllm:request_inference_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
    }
    assert {k: found.get(k) for k in expected} == expected
    values = scrape(tiny_server)
    assert values["vllm:time_to_first_token_seconds_count"] >= 1
    assert values["vllm:prefix_cache_queries_total"] >= values["vllm:prefix_cache_hits_total"]


def test_prefix_cache_hits_are_counted(tiny_server: ServerProcess, tiny_model: Path) -> None:
    c = client(tiny_server)
    prompt = list(range(30, 30 + 40))  # two full blocks of 16 shared, then a cache hit
    before = scrape(tiny_server)
    for _ in range(2):
        c.completions.create(model=str(tiny_model), prompt=prompt, max_tokens=2)
    after = scrape(tiny_server)
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == 32
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] \
        == 80


def test_models_health_version_tokenize(tiny_server: ServerProcess, tiny_model: Path) -> None:
    models = client(tiny_server).models.list().data
    assert [m.id for m in models] == [str(tiny_model)]
    assert models[0].model_extra is not None and models[0].model_extra["max_model_len"] == 1024
    assert tiny_server.request("GET", "/health").status == 200
    assert tiny_server.request("GET", "/version").json()["version"]
    tokens = tokenize(tiny_server, "Hello world")
    reply = tiny_server.request("POST", "/detokenize", {"tokens": tokens})
    assert reply.json() == {"prompt": "Hello world"}
    chat = tiny_server.request("POST", "/tokenize", {
        "messages": [{"role": "user", "content": "Hello"}]}).json()
    assert chat["count"] == len(chat["tokens"]) > len(tokenize(tiny_server, "Hello"))
    assert chat["max_model_len"] == 1024


def _error(server: ServerProcess, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    reply = server.request("POST", path, body)
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == reply.status
    return reply.status, error


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"prompt": "Hi", "temperature": -1}, None, "temperature must be a finite number >= 0"),
    ({"prompt": "Hi", "top_p": 2}, None, "top_p must be in (0, 1]"),
    ({"prompt": "Hi", "n": 2}, "n", "only n=1"),
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens", "at least 1"),
    ({"prompt": "Hi", "logprobs": 2}, "logprobs", "not supported"),
    ({"prompt": "Hi", "stream_options": {"include_usage": True}}, "stream_options",
     "stream is true"),
    ({"prompt": [5, 99999]}, "prompt", "token id 99999 is out of vocabulary"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [5] * 1030}, "prompt", "has 1030 tokens: 6 too many"),
    ({"prompt": [5] * 1000, "max_tokens": 30}, "max_tokens", "is 1030: 6 too many"),
    ({"max_tokens": 3}, None, "prompt: Field required"),
    ({"prompt": "Hi", "max_tokens": "many"}, None, "max_tokens"),
])
def test_invalid_requests_are_400(tiny_server: ServerProcess, body: dict[str, Any],
                                  param: str | None, words: str) -> None:
    status, error = _error(tiny_server, "/v1/completions", body)
    assert status == 400, error
    assert error["type"] == "BadRequestError"
    assert words in error["message"]
    assert error["param"] == param


def test_other_errors(tiny_server: ServerProcess, tiny_model: Path) -> None:
    status, error = _error(tiny_server, "/v1/completions", {"model": "gpt-4", "prompt": "Hi"})
    assert (status, error["type"], error["param"]) == (404, "NotFoundError", "model")
    assert "`gpt-4` does not exist" in error["message"]
    status, error = _error(tiny_server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    assert status == 400 and "only text content parts" in error["message"]
    reply = tiny_server.request("POST", "/v1/completions", b"{not json")
    assert reply.status == 400 and reply.json()["error"]["type"] == "BadRequestError"
    reply = tiny_server.request("GET", "/v1/nothing-here")
    assert reply.status == 404 and reply.json()["error"]["type"] == "NotFoundError"
    with pytest.raises(openai.BadRequestError) as caught:
        client(tiny_server).completions.create(model=str(tiny_model), prompt="Hi",
                                               temperature=-1)
    assert caught.value.status_code == 400


def test_client_disconnect_aborts_and_frees_blocks(
    tiny_server: ServerProcess, tiny_model: Path
) -> None:
    """A client that goes away mid-stream (or mid-wait) aborts its request: /metrics shows
    nothing running and the KV usage back at its idle value."""
    idle = scrape(tiny_server)
    assert idle["vllm:num_requests_running"] == 0
    for stream in (True, False):
        body = json.dumps({"model": str(tiny_model), "prompt": "Hello", "max_tokens": 900,
                           "stream": stream, "ignore_eos": True}).encode()
        conn = _open(tiny_server, body)
        if stream:
            assert conn.recv(4096)  # headers and the first events have come
        assert wait_for(lambda: scrape(tiny_server)["vllm:kv_cache_usage_perc"] > 0)
        assert scrape(tiny_server)["vllm:num_requests_running"] == 1
        conn.close()
        assert wait_for(lambda: scrape(tiny_server)["vllm:num_requests_running"] == 0)
        after = scrape(tiny_server)
        assert after["vllm:kv_cache_usage_perc"] == idle["vllm:kv_cache_usage_perc"]
        assert after["vllm:num_requests_waiting"] == 0


def _open(server: ServerProcess, body: bytes) -> Any:
    import socket

    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock
