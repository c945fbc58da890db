"""Benchmarks and GPU scripts: programs that measure, run as modules from the repository root.

Each prints figures (nothing here is a timed test) and has a smoke test that runs it small, so
none rots (``tests/bench/test_bench_smoke.py`` for the first three; the GPU scripts' smoke tests
sit beside the code they exercise).

==================  ===========================================================================
``simulator``       the whole ``twinserve simulate`` command on reference workloads (Vidur's
                    10,000-request stream in ``data/``; a million requests)
``scheduler``       µs per ``schedule()`` + ``update_from_output()`` for N running decodes
                    (side by side with vLLM's scheduler on one machine)
``reports``         reporting a synthetic million-request run, phase by phase
``gpu_attention``   the Triton attention kernels against the reference on a GPU (``--smoke``:
                    the CPU interpreter; ``tests/kernels/test_kernel_scripts.py``)
``gpu_real_smoke``  the real engine on an 8B-shaped dummy model on a GPU
                    (``tests/worker/test_gpu_smoke.py``)
``gpu_validate``    profile, measure and bundle runs on a GPU for ``twinserve validate
                    --measured`` (``tests/validation/test_validate_cmd.py``)
==================  ===========================================================================

``python -m bench.simulator vidur-stream --repeat 3`` and so on; no script patches ``sys.path``.
Nothing in the project imports ``bench`` (``tests/core/test_import_direction.py``).
"""
