"""Capacity planning (``twinserve plan``): the highest rate each layout sustains at the SLOs and
the fewest GPUs for a target rate.

=============  ==============================================================================
``capacity``   the noise-aware search for one layout's capacity (rate probes over seeds)
``planner``    candidate layouts, their searches on a sweep backend, the cheapest that holds
``report``     ``plan.csv``, the ranked ``plan.md`` and the probes behind them
=============  ==============================================================================

Each probe is a sweep point (``experiments.sweep.records.simulate_record``), cached like one.
"""
