"""The scheduling policies shipped with twinserve, beside vLLM's own (``engine/core/policy.py``).

Each is a short file whose docstring names its source; each is a plain class satisfying
``engine.core.policy.SchedulingPolicy``, built from a ``PolicyContext`` and named by
``--scheduling-policy NAME`` (``engine.core.policy_names.SHIPPED``), options by
``--policy-option KEY=VALUE``:

=================  ==========================================================================
``sjf``            shortest job first: the waiting queue by predicted output length
``srpt``           shortest remaining first: queue and victims by predicted remaining output
``edf``            earliest deadline first on per-request TTFT/TPOT SLOs (needs SLO classes)
``vtc``            per-tenant fair share by tokens served (the Virtual Token Counter)
``decode-first``   Sarathi-Serve's stall-free batching: decodes first, fixed prefill chunks
``prefill-first``  running prefills first, fixed chunks (decodes may stall)
``shed``           FCFS with load shedding when the predicted TTFT exceeds the SLO
=================  ==========================================================================

Length predictors for ``sjf``/``srpt`` are in ``predictors.py``. The same classes run in the
simulator and on the real engine; a user's own policy is any class with the same members
(``--scheduling-policy package.module:ClassName``).
"""
