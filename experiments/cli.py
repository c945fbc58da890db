"""The ``twinserve`` command line: one subcommand per job, each a thin layer over a library call.

Bad input (a malformed file, an invalid knob) ends with one ``twinserve: error: …`` line on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from engine.core.config import ConfigError

#: Exceptions that mean "the user gave us something wrong" (not a bug): reported in one line.
USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, ValueError, FileNotFoundError)


def _cmd_replay_schedule(args: argparse.Namespace) -> int:
    from experiments.replay import load_workload, replay

    workload = load_workload(args.workload)
    out = sys.stdout
    for record in replay(workload):
        out.write(json.dumps(record))
        out.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twinserve",
        description="LLM serving engine modelled on vLLM V1: one scheduler core, simulated or real.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "replay-schedule",
        help="replay a scripted workload through the scheduler; one JSON record per step",
        description="Replay a workload (shared/golden/README.md format) through the engine core "
        "and print one JSON record per engine step, as the golden traces of vLLM 0.33.0 do.",
    )
    p.add_argument("workload", help="workload JSON file")
    p.set_defaults(func=_cmd_replay_schedule)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except USER_ERRORS as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
