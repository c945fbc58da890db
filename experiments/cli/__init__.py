"""The ``twinserve`` command line: one subcommand per job, each a thin layer over a library call.

Each ``experiments/cli/cmd_*.py`` module registers its subcommands through
``register(subparsers)`` and imports its heavy dependencies (torch, pandas, simpy) only when its
command runs, so ``twinserve --help`` and the simulator start fast. Flags that several commands
share are defined once, in ``experiments.cli.flags``; the tail every run ends in (run directory,
printed summary) is ``experiments.cli.reporting``. ``python -m experiments.cli`` is
``twinserve``.

Bad input (a malformed file, an invalid knob) ends with one ``twinserve: error: …`` line on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from engine.core.errors import UserError

#: Modules that contribute subcommands, in ``--help`` order.
COMMAND_MODULES: tuple[str, ...] = (
    "experiments.cli.cmd_sim",
    "experiments.cli.cmd_reports",
    "experiments.cli.cmd_real",
    "experiments.cli.cmd_run_real",
    "experiments.cli.cmd_serve",
    "experiments.cli.cmd_topology",
    "experiments.cli.cmd_bench",
    "experiments.cli.cmd_validate",
    "experiments.cli.cmd_sweep",
    "experiments.cli.cmd_plan",
    "experiments.cli.cmd_core",
    "experiments.cli.cmd_compile",
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


#: Commands that do no sizable linear algebra (the real engine's commands run torch, which may
#: use OpenBLAS on some platforms, and are left alone).
_BLAS_LIGHT_COMMANDS = frozenset(
    {"simulate", "sweep", "plan", "report", "compare", "replay-schedule", "compile"}
)


def _one_blas_thread(argv: Sequence[str]) -> None:
    """numpy's OpenBLAS starts a thread per core at import, and they spin for a while: ≈ 0.1 s
    of CPU taken from the core a simulation's report process imports pandas on. These commands
    need one BLAS thread at most (a value the user exported is kept). Effective only before
    numpy is imported, which ``build_parser`` does."""
    if argv[:1] and argv[0] in _BLAS_LIGHT_COMMANDS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _importable_cwd() -> None:
    """Modules in the current directory can be imported, as with ``python -m``: a user's
    ``--scheduling-policy mymodule:MyPolicy`` next to where they run ``twinserve``. Appended,
    so it never shadows an installed module; processes the commands start inherit it."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def main(argv: Sequence[str] | None = None) -> int:
    _one_blas_thread(sys.argv[1:] if argv is None else argv)
    _importable_cwd()
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

