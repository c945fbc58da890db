"""Workloads: the request streams both worlds serve, built the same way for each.

A simulation (``sim``), a measured run (``twinserve run-real``) and a benchmark of a server
(``twinserve bench serve``) take their requests from here, so a simulated-vs-measured comparison
serves the very same stream. The package depends on the standard library, numpy, two leaf
modules of the core — ``engine.core.errors`` (bad input is a ``UserError``) and
``engine.core.config`` (the typed-field checks every config shares) — and, only when a ShareGPT
file is read, the ``tokenizers`` library that counts its tokens; never on ``sim``,
``engine.worker`` or ``engine.serve``.

==============  =======================================================================
``config``      ``WorkloadConfig``: everything that determines a workload (with its seed)
``stream``      ``Workload``: a request stream as columns, in send order
``build``       ``build_workload(cfg)``: the datasets ``random``, ``prefix_repetition``,
                ``trace``, ``sharegpt``
``arrivals``    vllm bench's synthetic arrival process and its ramp-up
``sharegpt``    ShareGPT-format conversation files (vllm bench's sampling of them)
``lengths``     seeded prompt/output lengths
``traces``      trace files (Vidur stream CSV, Azure 2023 CSV, Mooncake JSONL) and the
                shipped ones (``data/traces``)
``prompts``     seeded token ids with a workload's lengths and shared prefixes (real runs)
``admission``   the rule that turns a request away before it reaches the engine
``errors``      ``WorkloadError``
==============  =======================================================================

Submodules are imported explicitly (``from workload.build import build_workload``).
"""
