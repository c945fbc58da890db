"""Record the pipeline-parallel golden traces (seeds 4000-4401) with the vLLM oracle.

Run under the oracle's environment (its ``setup.sh``), from this directory::

    ORACLE_VENV/bin/python record_pipeline.py ORACLE_DIR scheduler

``ORACLE_DIR`` holds the oracle's ``gen_golden.py`` and ``oracle.py``. Each workload is one of
the oracle's random, edge or scale workloads with a synchronous scheduler and a batch queue one
batch per pipeline stage deep (``batch_queue_depth``), as vLLM 0.33 runs pipeline parallelism
with the V1 model runner (``VllmConfig.max_concurrent_batches`` = PP; async scheduling refused).
Scale workloads keep their first 150 requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: (first seed, count, workload maker, batch queue depth = PP degree)
PLAN = (
    (4000, 16, "random", 2),
    (4100, 16, "random", 4),
    (4200, 4, "edge", 2),
    (4300, 4, "edge", 4),
    (4400, 1, "scale", 2),
    (4401, 1, "scale", 4),
)
SCALE_REQUESTS = 150


def main() -> None:
    oracle_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path.insert(0, str(oracle_dir))
    import gen_golden  # the oracle's own workload makers and runner

    out_dir.mkdir(parents=True, exist_ok=True)
    for first, count, kind, depth in PLAN:
        for seed in range(first, first + count):
            workload = gen_golden.MAKERS[kind](seed)
            workload["config"]["async_scheduling"] = False
            workload["config"]["batch_queue_depth"] = depth
            if kind == "scale":
                workload["requests"] = workload["requests"][:SCALE_REQUESTS]
            path = out_dir / f"wl-{seed}.json"
            path.write_text(json.dumps(workload))
            trace = gen_golden.run_oracle(str(path))
            path.with_suffix(".jsonl").write_text(trace)
            print(f"seed {seed}: PP {depth}, {len(trace.splitlines())} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
