"""The ``twinserve`` command line: one subcommand per job, each a thin layer over a library call.

Each ``experiments/cmd_*.py`` module registers its subcommands through ``register(subparsers)``
and imports its heavy dependencies (torch, pandas, simpy) only when its command runs, so
``twinserve --help`` and the simulator start fast.

Bad input (a malformed file, an invalid knob) ends with one ``twinserve: error: …`` line on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from engine.core.errors import UserError

#: Modules that contribute subcommands, in ``--help`` order.
COMMAND_MODULES: tuple[str, ...] = (
    "experiments.cmd_sim",
    "experiments.cmd_reports",
    "experiments.cmd_real",
    "experiments.cmd_run_real",
    "experiments.cmd_validate",
    "experiments.cmd_sweep",
    "experiments.cmd_plan",
    "experiments.cmd_core",
    "experiments.cmd_compile",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twinserve",
        description="LLM serving engine modelled on vLLM V1: one scheduler core, simulated "
        "or real.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # a command module not present in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UserError as exc:
        print(f"twinserve: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("twinserve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
