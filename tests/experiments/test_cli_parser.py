"""``build_parser(command)`` builds only what one command needs, and that part is the same as
in the whole command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> list[tuple[tuple[str, ...], object]]:
    return [(tuple(a.option_strings) or (a.dest,), a.default) for a in parser._actions]


def test_each_command_is_built_as_in_the_whole_command_line() -> None:
    whole = _commands(build_parser())
    assert "simulate" in whole and len(whole) > 5
    for name, full in whole.items():
        alone = _commands(build_parser(name))
        assert name in alone and len(alone) <= len(whole)
        assert _options(alone[name]) == _options(full), name


def test_an_unknown_command_still_sees_every_command() -> None:
    assert _commands(build_parser("no-such-command")).keys() == _commands(build_parser()).keys()


def test_simulate_imports_no_other_command_module() -> None:
    code = ("import sys, experiments.cli as c; c.build_parser('simulate'); "
            "print(sorted(m for m in sys.modules if m.startswith('experiments.cli.cmd_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "['experiments.cli.cmd_sim']"


def test_an_unknown_command_is_refused_with_the_full_list(
        capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    assert main(["simulat"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'simulat'" in err and "'serve'" in err and "'sweep'" in err
