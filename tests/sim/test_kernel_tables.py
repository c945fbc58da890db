"""Reading the shipped kernel tables: one GPU's rows, exactly those a full parse gives."""

from __future__ import annotations

import csv

import pytest

from sim.cost.kernel_tables import DATA_DIR, _read, systems

TABLES = sorted(p.name for p in DATA_DIR.glob("*.csv") if p.name != "coverage.csv")


@pytest.mark.parametrize("name", TABLES)
def test_one_gpus_rows_are_those_of_a_full_parse(name: str) -> None:
    with (DATA_DIR / name).open(newline="") as f:
        header, *rows = list(csv.reader(f))
    for system in (*systems(), "b200", "no-such-gpu"):  # "b200": a prefix of "b200_sxm"
        got_header, got_rows = _read(name, system)
        assert got_header == header
        assert got_rows == [r for r in rows if r[0] == system]
    assert sum(len(_read(name, s)[1]) for s in systems()) > 0
