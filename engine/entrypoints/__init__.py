"""Online serving: vLLM V1's process layout around the shared engine core.

::

    clients ──HTTP──▶ API server 0..N-1 ──ZMQ (msgpack)──▶ EngineCore process ──▶ executor
                      (FastAPI/uvicorn:     ROUTER/DEALER     (EngineCore + EngineLoop,
                       validate, template,  requests ──▶       the busy loop, async batch
                       tokenize, detokenize, ◀── outputs       queue)
                       stop strings, SSE)   PULL/PUSH

* ``launcher`` — starts, watches and stops the processes (``twinserve serve``);
* ``api_proc`` / ``openai/`` — an API server process: routes, request and response formats,
  the generation path (``openai/serving.py``);
* ``engine_client`` / ``stream`` — an API server's IPC and per-request output path;
* ``engine_proc`` / ``engine_stats`` — the EngineCore process;
* ``wire`` — the messages between them; ``clock`` — their one time base; ``records`` — the
  stage records each process leaves; ``metrics`` — Prometheus metrics with vLLM's names.

Nothing here imports torch or the simulator: the engine behind the EngineCore process comes
from an ``engine_proc.EngineFactory`` given by the layer that composes the server.
"""
