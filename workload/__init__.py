"""Workloads: the request streams both worlds serve, built the same way for each.

A simulation (``sim``) and a measured run (``twinserve run-real``) take their requests from
here, so a simulated-vs-measured comparison serves the very same stream. The package depends on
the standard library, numpy, and two leaf modules of the core — ``engine.core.errors`` (bad input
is a ``UserError``) and ``engine.core.config`` (the typed-field checks every config shares) —
never on ``sim``, ``engine.worker`` or ``engine.serve``.

==============  =======================================================================
``config``      ``WorkloadConfig``: everything that determines a workload (with its seed)
``stream``      ``Workload``: a request stream as columns, in send order
``build``       ``build_workload(cfg)``: the datasets ``random``, ``prefix_repetition``,
                ``trace``
``arrivals``    vllm bench's synthetic arrival process
``lengths``     seeded prompt/output lengths
``traces``      trace files (Vidur stream CSV, Azure 2023 CSV, Mooncake JSONL) and the
                shipped ones (``data/traces``)
``prompts``     seeded token ids with a workload's lengths and shared prefixes (real runs)
``admission``   the rule that turns a request away before it reaches the engine
``errors``      ``WorkloadError``
==============  =======================================================================

Submodules are imported explicitly (``from workload.build import build_workload``).
"""
