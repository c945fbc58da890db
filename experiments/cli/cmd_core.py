"""Subcommands that exercise the engine core alone: ``replay-schedule``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _replay_schedule(args: argparse.Namespace) -> int:
    from experiments.replay import load_workload, replay

    workload = load_workload(args.workload)
    write = sys.stdout.write
    for record in replay(workload):
        write(json.dumps(record))
        write("\n")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay-schedule",
        help="replay a scripted workload through the scheduler; one JSON record per step",
        description="Replay a workload (tests/golden/README.md format) through the engine core "
        "and print one JSON record per engine step, as the golden traces of vLLM 0.33.0 do.",
    )
    p.add_argument("workload", help="workload JSON file")
    p.set_defaults(func=_replay_schedule)
