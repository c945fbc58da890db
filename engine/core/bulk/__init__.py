"""Exact bulk application of engine iterations between decisions ("bulk runs").

Between two *decisions* — an admission, a preemption, a request arriving — the engine loop
follows a fixed pattern: every running request decodes one token per iteration until it reaches
its length limit, except possibly the **last** running request, which may still be prefilling
(it takes what the token budget leaves after the decodes, chunk by chunk, then decodes too).
``find.py`` recognises such a state and describes the iterations that follow it (``run.py``);
``apply.py`` applies ``K`` of them at once with *exactly* the state changes ``K`` calls of
``begin_step``/``finish_step`` would make — the same tokens, counters, finishes, block tables,
block ids (popped from the free queue in the same order), frees, prefix-hash registrations (same
order) — in time O(R + K + K·R/B) instead of O(K·R); ``records.py`` holds what a run hands back
and the step records it leaves. ``tests/core/test_fast_forward.py`` checks the equality on
random states.

The fence: the package reads the scheduler and the batch in flight, never the ``EngineCore``;
the scheduler's state changes only through its own transitions (``Scheduler.admit_waiting``,
``finish_length_capped``, ``end_bulk_run``), block tables only through the KV cache manager,
and the chunk sizes come from the scheduler's own rule (``engine/core/chunking.py``).

One iteration is vLLM's engine loop body: ``schedule(S+k)`` then the update of the oldest batch
— step ``S+k`` itself when synchronous, step ``S+k−1`` under async scheduling (one batch stays
in flight, so updates lag one step, prefix caching lags one token, and a request whose last
token is in flight is skipped by ``schedule()``, finishing at that iteration's update).

**Decoders.** A request in the steady decode state at iteration ``a`` (context ``c`` = its
``num_computed_tokens`` before that schedule, ``n`` outputs, ``t`` known tokens, ``max_tokens``
M) gets a token at the updates of iterations ``a, a+1, …`` and finishes at the update of
``f = a + min(M − n, max_model_len − t) − 1``; it is scheduled (one token, context
``c + k − a``) in iterations ``a..f`` when synchronous and ``a..f−1`` under async scheduling.
Requests running at the start decode from ``a = 0``.

**The tail prefiller.** The last running request may be mid-prefill. In iteration ``k`` it is
scheduled ``min(remaining, token budget − decodes of iteration k)`` tokens (capped by the long
prefill threshold as the scheduler caps it) until a chunk completes its prompt, at iteration
``j``; from ``a = j + 1`` it is a decoder as above (synchronous: its first token came at the
update of ``j``; async: it arrives at the update of ``j + 1``).

**Limits.** A run never reaches an iteration whose ``schedule()`` might admit a waiting
request, one that would schedule nothing, nor one whose KV blocks might not fit (allocations
are bounded by the free blocks at the start: frees during the run are not counted, so no
preemption can occur). A schedule() with budget left and a free seat tries the head of the
queue; a run holds such iterations only where the head surely stays refused for its KV blocks
— it does not fit with the most room the run could leave it, and until a request finishes no
block is freed and, the running requests registering only private blocks, no prefix hit is
added (``find._head_stays_blocked``) — and ends at the first schedule() after a finish.

**Scheduling policies.** All of this is vLLM's policy (``engine/core/policy.py``): running
requests get budget in admission order, the head of the waiting queue is admitted whenever it
fits, prefills are chunked by the long-prefill threshold rule. The waiting order and the victim
never matter here (the head is whatever the queue peeks; no run preempts). A policy declares
which of the three it keeps (``BulkProperty``) and ``find_bulk_run`` finds runs only where the
others cannot matter: none without the running order, none with a prefiller without the
chunking, none planning an admission without both the admission and the chunking.
"""
