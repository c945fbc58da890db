"""Calibration of the vLLM step model on operator-level data: the shipped coefficients are what
the calibration script fits, the docs show its current output, and the tables' interpolation
predicts held-out measurements within bounds."""

from __future__ import annotations

import re

import pytest

from sim.cost.calibration import kernels
from sim.cost.elementwise import COEFFICIENTS, fit_for


@pytest.fixture(scope="module")
def calibration() -> tuple:
    return kernels.calibrate()


def test_shipped_elementwise_coefficients_are_the_fit(calibration: tuple) -> None:
    fits, _rows, lines = calibration
    assert COEFFICIENTS.read_text().splitlines() == lines
    for f in fits:
        assert fit_for(f.gpu).bw_efficiency == f.bw_efficiency
    assert fit_for("h200-sxm").bw_efficiency == fit_for("h100-sxm").bw_efficiency


def test_docs_show_the_current_calibration(calibration: tuple) -> None:
    fits, rows, _ = calibration
    doc = kernels.DOCS.read_text()
    section = re.search(re.escape(kernels.BEGIN) + r"\n(.*)\n" + re.escape(kernels.END), doc,
                        re.S)
    assert section is not None
    assert section.group(1) == kernels.markdown(rows, fits)


CATALOG_SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm")


@pytest.mark.parametrize("operator,median,p90", [
    ("GEMM (n, k lines)", 0.06, 0.20),
    ("GEMM (token counts)", 0.06, 0.25),
    ("decode attention (context)", 0.05, 0.20),
    ("decode attention (batch)", 0.05, 0.20),
    ("prefill attention (prompt length)", 0.05, 0.12),
    ("all-reduce (vllm_graph)", 0.05, 0.30),
])
def test_held_out_table_cells_are_predicted(calibration: tuple, operator: str, median: float,
                                            p90: float) -> None:
    _, rows, _ = calibration
    checked = 0
    for r in rows:
        if r.operator == operator and r.gpu in CATALOG_SYSTEMS:
            med, top, _ = kernels._stats(r.held_errors)
            assert len(r.held_errors) > 20, (r.gpu, r.dtype)
            assert med < median and top < p90, (r.gpu, r.dtype, med, top)
            checked += 1
    assert checked >= 3


def test_elementwise_fit_holds_on_the_held_out_model(calibration: tuple) -> None:
    _, rows, _ = calibration
    for r in rows:
        if r.operator == "element-wise: all":
            fit_med, _, _ = kernels._stats(r.fit_errors)
            held_med, held_p90, _ = kernels._stats(r.held_errors)
            assert fit_med < 0.25 and held_med < 0.25 and held_p90 < 0.45, r.gpu
