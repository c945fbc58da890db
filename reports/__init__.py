"""Reports: per-request events → the numbers users trust, where the time went, pictures.

Works identically for simulated and real runs: everything is derived from the core's
``engine.core.events.EventLog`` (the only project import allowed here, besides numpy, pyarrow,
pandas and matplotlib). Definitions follow ``vllm bench serve`` (METRICS.md §1). The path from
a log to a run directory without plots computes on numpy columns and never imports pandas;
DataFrames are a conversion away.

=====================  =====================================================================
``tables``             ``build_columns(log) -> RunColumns`` (numpy columns) and
                       ``build_tables(log) -> RunTables`` (DataFrames): requests, steps,
                       token runs
``columns``            the column tables, and conversion to and from DataFrames
``parquet``            a column table as the Parquet file pandas would write
``metrics``            ``summarize(tables, meta, …)``: vllm-bench JSON keys + our sections;
                       ``format_summary(summary)``: the "Serving Benchmark Result" block
``stats``, ``itl``     numpy-exact (weighted) percentiles; pooled ITLs from token runs
``breakdown``          the request-path segments (METRICS §3), shares at p50/p99
``diagnosis``          ``diagnose(tables, meta) -> Diagnosis``: verdict + one paragraph
``engine_stats``       engine-side statistics (METRICS §2)
``plots``              PNG plots (CDFs, KV/queues, batch composition, breakdown, rate sweep)
``render``             ``report.md`` and self-contained ``report.html``
``run_dir``            ``write_run_dir`` / ``load_run_dir`` / ``rebuild_report``
``compare``            ``compare_runs(run_dirs, out_dir, labels)``
``meta``, ``options``  run metadata and JSON; vllm-style option parsing (``ReportError``)
=====================  =====================================================================

Submodules are imported explicitly (``from reports.metrics import summarize``) so that
importing the package costs nothing.
"""
