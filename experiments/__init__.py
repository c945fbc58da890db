"""Everything that composes the engine, the simulator and the reports into jobs.

================  =============================================================================
``cli``           the ``twinserve`` command line (one ``cmd_*`` module per group of commands;
                  ``flags``: the flags several commands share)
``sweep``         experiment files, cached sweeps on a backend, flat result records
``plan``          capacity planning on top of the sweeps
``validation``    profiling the real engine, fitted cost models, simulated vs measured runs
``simconfig``     ``SimConfig`` dicts from flag values and experiment files
``run_meta``      the ``config.json`` of a simulated or a measured run
``provenance``    version, commit, date and compiled modules stamped into every run
``replay``        the golden-replay driver (``twinserve replay-schedule``)
================  =============================================================================
"""
