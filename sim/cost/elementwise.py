"""Memory-bound element-wise kernels (norms, rotary, activation, KV-cache write, sampler passes).

vLLM 0.33 generates these with Inductor (``custom_ops = ["none"]`` at ``-O2``); none of them is
in the aiconfigurator tables. Each is priced by the bytes it moves:

    time = bytes / (HBM bandwidth · bw_efficiency) + floor

with ``bw_efficiency`` and ``floor`` fitted per GPU on Vidur's measured RMSNorm, rotary,
SiLU-and-mul and residual-add kernels (``sim/data/profiles/vidur``) by
``python -m sim.cost.calibration.kernels --write`` into ``sim/data/kernels/elementwise.csv``.
A GPU without Vidur profiles takes the coefficients of the GPU named in its ``source``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine.core.config import ConfigError

COEFFICIENTS = Path(__file__).resolve().parents[1] / "data" / "kernels" / "elementwise.csv"


@dataclass(frozen=True, slots=True)
class ElementwiseFit:
    """Fitted element-wise kernel model of one GPU."""

    gpu: str  # catalog name
    bw_efficiency: float  # fraction of HBM bandwidth the kernels reach
    floor_s: float  # time of the smallest kernel
    source: str  # what the values were fitted on (or inherited from)


@lru_cache(maxsize=1)
def fits() -> dict[str, ElementwiseFit]:
    """The shipped fits by catalog GPU name."""
    out = {}
    with COEFFICIENTS.open(newline="") as f:
        for r in csv.DictReader(f):
            out[r["gpu"]] = ElementwiseFit(
                r["gpu"], float(r["bw_efficiency"]), float(r["floor_us"]) * 1e-6, r["source"]
            )
    return out


def fit_for(gpu: str) -> ElementwiseFit:
    got = fits().get(gpu)
    if got is None:
        raise ConfigError(
            f"no element-wise kernel fit for GPU {gpu!r} in {COEFFICIENTS.name}; fitted: "
            f"{', '.join(sorted(fits()))}"
        )
    return got
