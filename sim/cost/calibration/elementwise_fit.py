"""Fit the element-wise kernel model (``sim/cost/elementwise.py``) on Vidur's measured kernels.

Rows: every (model, token count, TP degree) row of ``sim/data/profiles/vidur/compute/<gpu>/
**/mlp.csv`` gives the median times of five memory-bound kernels; their bytes moved are
counted as a single pass over inputs and outputs (a = 2 bytes, t = TP degree, h hidden,
f MLP width, H / K query / KV heads, d head dim):

* ``input_layernorm``, ``post_attention_layernorm`` — RMSNorm: 2·T·h·a
* ``attn_rope`` — rotary on q and k in place: 2·T·(H/t + max(K/t, 1))·d·a
* ``mlp_act`` — SiLU-and-mul: 3·T·(f/t)·a (GELU of a non-gated MLP: 2·T·(f/t)·a)

(Vidur's separate residual ``add`` is not used: vLLM 0.33 has no such kernel, the add is fused
into the RMSNorm.)

``time = bytes / (B · bw_efficiency) + floor`` is fitted per GPU by minimising the mean squared
log error (relative error) over a fine grid of (bw_efficiency, floor). One model is held out
(``HELD_OUT_MODEL``, as the roofline calibration does), so the held-out error is the error on a
model shape the fit never saw.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROFILES = Path(__file__).resolve().parents[2] / "data" / "profiles" / "vidur" / "compute"
HELD_OUT_MODEL = "internlm/internlm-20b"
#: The profiled kernels with a counterpart in vLLM 0.33's step. Vidur's separate residual
#: ``add`` is left out: vLLM 0.33 fuses the residual add into the RMSNorm kernel.
OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act")
#: Vidur profile directory -> catalog GPU name and datasheet HBM bandwidth (bytes/s).
VIDUR_GPUS = {"h100": ("h100-sxm", 3.35e12), "a100": ("a100-80gb", 2.039e12)}
#: Catalog GPUs without Vidur profiles: the GPU whose fit they take (same compute die).
#: Catalog GPUs without Vidur profiles: (the GPU whose fit they take, why that one).
INHERITED = {
    "h200-sxm": ("h100-sxm", "same compute die"),
    "h100-pcie": ("h100-sxm", "same compute architecture"),
    "b200": ("h100-sxm", "nearest calibrated generation; an estimate"),
    "gb200": ("h100-sxm", "nearest calibrated generation; an estimate"),
    "a100-40gb": ("a100-80gb", "same compute die"),
    "l40s": ("a100-80gb", "nearest calibrated generation; an estimate"),
    "l4": ("a100-80gb", "nearest calibrated generation; an estimate"),
    "mi300x": ("h100-sxm", "no AMD profile; an estimate"),
    "mi325x": ("h100-sxm", "no AMD profile; an estimate"),
}


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    op: str
    tokens: int
    tp: int
    nbytes: float
    time_s: float


@dataclass(frozen=True, slots=True)
class Fit:
    gpu: str
    bw_efficiency: float
    floor_s: float
    fit_rows: int
    held_rows: int


def op_bytes(op: str, r: dict[str, str]) -> float:
    a = 2.0
    t = int(r["num_tensor_parallel_workers"])
    tokens = int(r["num_tokens"])
    h, heads, kv = int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])
    f = int(r["n_expanded_embd"])
    d = h / heads
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 2 * tokens * h * a
    if op == "attn_rope":
        return 2 * tokens * (heads / t + max(kv / t, 1)) * d * a
    if op == "mlp_act":
        gated = r["use_gated_mlp"].strip().lower() == "true"
        return (3 if gated else 2) * tokens * (f / t) * a
    raise ValueError(op)


def read_rows(vidur_gpu: str) -> list[Row]:
    rows = []
    for path in sorted((PROFILES / vidur_gpu).glob("*/*/mlp.csv")):
        model = f"{path.parent.parent.name}/{path.parent.name}"
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                for op in OPS:
                    raw = r.get(f"time_stats.{op}.median", "")
                    if not raw or float(raw) <= 0:
                        continue
                    rows.append(Row(model, op, int(r["num_tokens"]),
                                    int(r["num_tensor_parallel_workers"]), op_bytes(op, r),
                                    float(raw) * 1e-3))
    return rows


def predict(rows: list[Row], bw: float, eff: float, floor_s: float) -> np.ndarray:
    nbytes = np.array([r.nbytes for r in rows])
    out: np.ndarray = nbytes / (bw * eff) + floor_s
    return out


def _search(nbytes: np.ndarray, log_y: np.ndarray, bw: float, effs: np.ndarray,
            floors_us: np.ndarray) -> tuple[float, float]:
    best = (math.inf, 0.0, 0.0)
    for eff in effs:
        pred = (nbytes / (bw * eff))[None, :] + floors_us[:, None] * 1e-6
        loss = ((np.log(pred) - log_y[None, :]) ** 2).mean(axis=1)
        i = int(np.argmin(loss))
        if loss[i] < best[0]:
            best = (float(loss[i]), float(eff), float(floors_us[i]))
    return best[1], best[2]


def fit(rows: list[Row], bw: float) -> tuple[float, float]:
    """(bw_efficiency, floor_s) minimising the mean squared log error: a coarse grid
    (0.02 × 0.2 µs), then a fine one (0.001 × 0.01 µs) around its best point."""
    nbytes = np.array([r.nbytes for r in rows])
    log_y = np.log(np.array([r.time_s for r in rows]))
    eff, floor_us = _search(nbytes, log_y, bw, np.arange(0.1, 1.0001, 0.02),
                            np.arange(0.0, 10.0001, 0.2))
    eff, floor_us = _search(nbytes, log_y, bw,
                            np.arange(max(eff - 0.02, 0.05), eff + 0.0201, 0.001),
                            np.arange(max(floor_us - 0.2, 0.0), floor_us + 0.201, 0.01))
    return round(eff, 3), round(floor_us, 2) * 1e-6


def errors(rows: list[Row], bw: float, eff: float, floor_s: float) -> np.ndarray:
    y = np.array([r.time_s for r in rows])
    out: np.ndarray = predict(rows, bw, eff, floor_s) / y - 1
    return out


def fit_all() -> tuple[list[Fit], dict[str, list[Row]]]:
    """The fit of every Vidur GPU (on all models but the held-out one), and their rows."""
    out, all_rows = [], {}
    for vidur_gpu, (gpu, bw) in VIDUR_GPUS.items():
        rows = read_rows(vidur_gpu)
        all_rows[gpu] = rows
        fit_rows = [r for r in rows if r.model != HELD_OUT_MODEL]
        eff, floor_s = fit(fit_rows, bw)
        out.append(Fit(gpu, eff, floor_s, len(fit_rows), len(rows) - len(fit_rows)))
    return out, all_rows
