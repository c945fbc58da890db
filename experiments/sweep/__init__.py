"""Sweeps: many simulated points from one experiment file, each run once, into one tidy table.

=============  ==============================================================================
``expfile``    experiment files (base config × grid × variants × seeds) → validated points
``runner``     the result cache keyed by the full config, running tasks on a backend
``backends``   where tasks run: inline, a local process pool, or a Ray cluster
``records``    one simulated point → one flat record (config columns + every summary metric)
``report``     ``run_experiment``: the points' records, aggregated over seeds, as tables
``plots``      latency and goodput against request rate, one line per variant
=============  ==============================================================================

Capacity planning (``experiments.plan``) is built on the same runner and records.
"""
