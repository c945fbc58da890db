"""``twinserve topology``: the processes, roles, ranks, devices and links of a deployment.

``twinserve topology -tp T -pp P -dp D [--api-server-count N]`` prints what ``twinserve serve``
with the same flags starts (``engine/entrypoints/topology.py``): TP=4 is 1 API server + 1
EngineCore + 4 workers = 6 processes; TP=2 × DP=4 is 4 API servers + 4 EngineCores + 8 workers
+ 1 DP coordinator = 17.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.core.config import ConfigError


def add_layout_flags(g: Any) -> None:
    """The parallel-layout flags ``topology`` and ``serve`` share (vLLM's names)."""
    g.add_argument("--tensor-parallel-size", "-tp", type=int,
                   help="ranks per pipeline stage (1)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, help="pipeline stages (1)")
    g.add_argument("--data-parallel-size", "-dp", type=int,
                   help="engine replicas, each with its own TP × PP workers (1)")
    g.add_argument("--api-server-count", type=int,
                   help="API server processes (default: the DP degree, as vLLM's)")
    g.add_argument("--distributed-executor-backend", choices=["uni", "mp"],
                   help="uni: the model inside the EngineCore (one rank only); mp: one worker "
                   "process per rank (default: mp when TP × PP > 1)")


def parallel_from_flags(args: argparse.Namespace) -> Any:
    from engine.core.parallel import ParallelConfig

    def given(value: int | None) -> int:
        return 1 if value is None else value

    return ParallelConfig(
        tensor_parallel_size=given(args.tensor_parallel_size),
        pipeline_parallel_size=given(args.pipeline_parallel_size),
        data_parallel_size=given(args.data_parallel_size),
    )


def _topology(args: argparse.Namespace) -> int:
    from engine.entrypoints.topology import format_topology, plan_topology

    if args.api_server_count is not None and args.api_server_count < 1:
        raise ConfigError(f"--api-server-count must be >= 1, got {args.api_server_count}")
    topo = plan_topology(
        parallel_from_flags(args), api_server_count=args.api_server_count,
        device_kind=args.device, executor_backend=args.distributed_executor_backend,
        devices_per_node=args.devices_per_node,
    )
    print(format_topology(topo))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "topology", help="print the processes, ranks, devices and links `serve` would start",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("layout (the flags of twinserve serve)")
    add_layout_flags(g)
    g.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="what each rank computes on (cuda)")
    g.add_argument("--devices-per-node", type=int, default=8,
                   help="GPUs per node: larger layouts span nodes (8)")
    p.set_defaults(func=_topology)
