"""The roofline's catalog constants are what the calibration finds on the shipped profiles.

Reruns ``sim/cost/calibration/roofline.py``'s fit on ``sim/data/profiles`` (a few seconds) so
the constants in ``sim/hardware.py`` and ``RooflineParams.kernel_floor_s`` cannot drift from the
data, and checks the simulator itself — ``RooflineCostModel`` with the catalog GPUs and default
parameters — against the held-out measurements (a model the fit never saw; all-reduce world
size 4).

Error bounds. With the current constants the held-out GEMM error is ≈ 10 % median / 23 % p90
(H100) and ≈ 8 % / 20 % (A100); the held-out all-reduce error ≈ 8–9 % median. The fit is
deterministic, so the margin above those (to 12 % median, 30 % p90 for GEMMs; 12 % median for
all-reduce) only absorbs deliberate small changes of data or formula. It still catches real
drift: compute efficiency 20 % low gives 26–28 % held-out median, a doubled H100 floor 17 %,
and the pre-calibration all-reduce constants (12–15 µs, ε 0.45) 21–48 %.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from sim.cost.calibration.roofline import (
    CATALOG_GPU,
    DATA_DIR,
    GEMM_OPS,
    HELD_OUT_MODEL,
    AllReduceParams,
    GemmParams,
    GpuCalibration,
    block_spec,
    calibrate,
    gemm_shapes,
    predict_allreduce,
    predict_gemm,
    rel_errors,
)
from sim.cost.roofline import RooflineCostModel, RooflineParams
from sim.hardware import get_gpu

#: |catalog − unrounded fit| allowed: half the catalog's rounding step plus as much again.
TOLERANCE = {
    "compute_efficiency": 0.01,
    "memory_efficiency": 0.01,
    "kernel_floor_s": 0.2e-6,
    "allreduce_latency_s": 1e-6,
    "allreduce_efficiency": 0.01,
}
GEMM_HELD_OUT_MEDIAN = 0.12
GEMM_HELD_OUT_P90 = 0.30
ALLREDUCE_HELD_OUT_MEDIAN = 0.12


@pytest.fixture(scope="module")
def cals() -> list[GpuCalibration]:
    return calibrate(DATA_DIR, free_floor=False)


def test_profiles_are_in_the_repository() -> None:
    assert DATA_DIR.is_dir() and "shared" not in DATA_DIR.parts
    assert (DATA_DIR / "LICENSE").read_text().lstrip().startswith("MIT License")
    for gpu in CATALOG_GPU:
        assert len(list((DATA_DIR / "compute" / gpu).glob("*/*/mlp.csv"))) >= 6


def test_catalog_constants_are_the_fitted_ones(cals: list[GpuCalibration]) -> None:
    floor = RooflineParams().kernel_floor_s
    for c in cals:
        gpu = get_gpu(c.catalog_name)
        fitted = {
            "compute_efficiency": (c.shared.compute_efficiency, gpu.compute_efficiency),
            "memory_efficiency": (c.shared.memory_efficiency, gpu.memory_efficiency),
            "kernel_floor_s": (c.shared.kernel_floor_s, floor),
            "allreduce_latency_s": (c.allreduce.latency_s, gpu.allreduce_latency_s),
            "allreduce_efficiency": (c.allreduce.efficiency, gpu.allreduce_efficiency),
        }
        for name, (fit, catalog) in fitted.items():
            assert abs(fit - catalog) <= TOLERANCE[name], (c.catalog_name, name, fit, catalog)


def test_h200_takes_the_h100_fit() -> None:
    h100, h200 = get_gpu("h100-sxm"), get_gpu("h200-sxm")
    for name in ("compute_efficiency", "memory_efficiency", "allreduce_latency_s",
                 "allreduce_efficiency"):
        assert getattr(h200, name) == getattr(h100, name)


def _simulated_held_out(gpu_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """(simulated, measured) seconds of every held-out GEMM, through RooflineCostModel."""
    gpu = get_gpu(CATALOG_GPU[gpu_dir])
    path = DATA_DIR / "compute" / gpu_dir / f"{HELD_OUT_MODEL}" / "mlp.csv"
    simulated, measured = [], []
    models: dict[int, tuple[RooflineCostModel, list]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            tp, tokens = int(row["num_tensor_parallel_workers"]), int(row["num_tokens"])
            if tp not in models:
                model = RooflineCostModel(block_spec(HELD_OUT_MODEL, row), gpu, tp)
                models[tp] = (model, gemm_shapes(model, row))
            model, shapes = models[tp]
            for op, (k, n) in zip(GEMM_OPS, shapes, strict=True):
                simulated.append(model._gemm_time(tokens, k, n))
                measured.append(float(row[f"time_stats.{op}.median"]) * 1e-3)
    return np.array(simulated), np.array(measured)


def test_fit_formula_is_the_simulators(cals: list[GpuCalibration]) -> None:
    """The vectorised prediction the fit minimises equals ``RooflineCostModel._gemm_time``."""
    for c in cals:
        gpu = get_gpu(c.catalog_name)
        held = c.gemm_rows.subset(c.gemm_rows.held_out)
        catalog = GemmParams(gpu.compute_efficiency, gpu.memory_efficiency,
                             RooflineParams().kernel_floor_s)
        simulated, measured = _simulated_held_out(c.gpu)
        np.testing.assert_array_equal(held.measured_s, measured)
        np.testing.assert_allclose(predict_gemm(held, gpu, catalog), simulated, rtol=1e-9)


def test_held_out_gemm_error_of_the_simulator(cals: list[GpuCalibration]) -> None:
    for c in cals:
        simulated, measured = _simulated_held_out(c.gpu)
        err = np.abs(rel_errors(simulated, measured))
        assert err.size == 4 * 1044
        assert np.median(err) < GEMM_HELD_OUT_MEDIAN, (c.gpu, np.median(err))
        assert np.percentile(err, 90) < GEMM_HELD_OUT_P90, (c.gpu, np.percentile(err, 90))


def test_held_out_allreduce_error_of_the_catalog(cals: list[GpuCalibration]) -> None:
    for c in cals:
        gpu = get_gpu(c.catalog_name)
        held = c.allreduce_rows.subset(c.allreduce_rows.held_out)
        assert held.size.size > 900
        catalog = AllReduceParams(gpu.allreduce_latency_s, gpu.allreduce_efficiency)
        err = np.abs(rel_errors(predict_allreduce(held, catalog), held.measured_s))
        assert np.median(err) < ALLREDUCE_HELD_OUT_MEDIAN, (c.gpu, np.median(err))
        # and the ring term is the simulator's: one 1 MiB all-reduce on t = 4 GPUs
        spec = block_spec("ar", {"n_embd": "4096", "n_head": "32", "n_kv_head": "8",
                                 "n_expanded_embd": "1", "vocab_size": "1"})
        model = RooflineCostModel(spec, gpu, 4)
        expected = 2 * 3 / 4 * 2**20 / (gpu.link_bw_bytes_s * gpu.allreduce_efficiency)
        assert model._allreduce_time(2**20 // (4096 * 2)) == pytest.approx(
            expected + gpu.allreduce_latency_s, rel=1e-12)
