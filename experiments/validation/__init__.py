"""Validation of the simulator against the real engine (``twinserve profile`` and ``validate``).

=============  ==============================================================================
``profiling``  profile the real engine (step grid, front-end and loop CPU) and fit a cost model
``runs``       measured runs of a workload, and the simulated runs that replay them
``report``     simulated-vs-measured errors per metric and per request-path stage
=============  ==============================================================================
"""
