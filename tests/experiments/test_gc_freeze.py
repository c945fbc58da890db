"""Start-up objects frozen out of the garbage collector's way (engine/gc_freeze.py), as the
CLI uses them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from engine.gc_freeze import frozen_when_done, unfrozen_when_done
from experiments.cli import main


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


def test_collection_is_paused_then_what_was_made_is_frozen() -> None:
    with frozen_when_done():
        assert not gc.isenabled()
        made = [[] for _ in range(100)]  # containers the collector tracks
        assert gc.get_freeze_count() == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made) + 1
    assert gc.is_tracked(made)


def test_a_collector_the_caller_turned_off_is_left_alone() -> None:
    gc.disable()
    with frozen_when_done():
        assert not gc.isenabled()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_collector_is_restored_when_the_block_raises() -> None:
    with pytest.raises(ValueError), frozen_when_done():
        raise ValueError("bad flag")
    assert gc.isenabled()


def test_unfrozen_when_done_undoes_the_freezes_inside_it() -> None:
    with unfrozen_when_done():
        with frozen_when_done():
            pass
        with frozen_when_done():  # a command's own start-up, after the parser's
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_unfrozen_when_done_keeps_a_freeze_the_caller_made() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    with unfrozen_when_done(), frozen_when_done():
        pass
    assert gc.get_freeze_count() >= frozen > 0


def test_a_simulation_run_in_process_leaves_the_collector_as_it_was(tmp_path) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--num-prompts", "3", "--no-plots", "--no-progress",
                 "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
