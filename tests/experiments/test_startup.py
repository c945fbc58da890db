"""The CLI's start-up and the cyclic garbage collector (experiments/cli/startup.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from experiments.cli import main
from experiments.cli.startup import command_collection, startup


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    """Each test starts with the collector on and nothing frozen, and leaves it so."""
    was_enabled = gc.isenabled()
    gc.unfreeze()
    gc.enable()
    yield
    gc.unfreeze()
    if not was_enabled:
        gc.disable()


def test_startup_pauses_collection_then_freezes_what_it_made() -> None:
    with startup():
        assert not gc.isenabled()
        made = [[] for _ in range(100)]  # containers the collector tracks
        assert gc.get_freeze_count() == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made) + 1
    assert gc.is_tracked(made)


def test_startup_leaves_a_collector_the_caller_turned_off_alone() -> None:
    gc.disable()
    with startup():
        assert not gc.isenabled()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_startup_restores_the_collector_when_its_block_raises() -> None:
    with pytest.raises(ValueError), startup():
        raise ValueError("bad flag")
    assert gc.isenabled()


def test_command_collection_unfreezes_what_its_startups_froze() -> None:
    with command_collection():
        with startup():
            pass
        with startup():  # a command's own start-up, after the parser's
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_command_collection_keeps_a_freeze_the_caller_made() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    with command_collection(), startup():
        pass
    assert gc.get_freeze_count() >= frozen > 0


def test_a_simulation_run_in_process_leaves_the_collector_as_it_was(tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--num-prompts", "3", "--no-plots", "--no-progress",
                 "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
