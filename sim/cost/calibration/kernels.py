"""Calibrate the vLLM step cost model on operator-level measurements and report its errors.

    python -m sim.cost.calibration.kernels            # print the fit / hold-out tables
    python -m sim.cost.calibration.kernels --write    # also regenerate elementwise.csv
    python -m sim.cost.calibration.kernels --write-docs  # and docs/cost_model.md §4

Two kinds of calibration, both on measured kernels only (never on serving results):

* **Fitted coefficients** — the element-wise model (``sim/cost/elementwise.py``): bandwidth
  efficiency and floor per GPU, fitted on Vidur's RMSNorm / rotary / SiLU-and-mul kernels with
  one model held out (``elementwise_fit.py``); written to ``sim/data/kernels/elementwise.csv``.
* **Interpolated tables** — GEMM, attention and all-reduce come from the measured tables
  themselves (``sim/cost/kernel_tables.py``), so on their grid points they are exact. Their
  error is the interpolation's between grid points: whole grid lines are held out of the
  table, predicted from the remaining ones by the very code the simulator runs, and compared
  with the measurement.

Errors are ``predicted / measured − 1`` over cells; tables give the median and 90th percentile
of its absolute value and the median signed error.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.cost.calibration import elementwise_fit as ew
from sim.cost.elementwise import COEFFICIENTS
from sim.cost.interp import Curve, Grid
from sim.cost.kernel_tables import KernelTables, _loglog_curve, gemm_curve, load_tables, systems

DOCS = Path(__file__).resolve().parents[3] / "docs" / "cost_model.md"
BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"

#: Grid lines held out of the tables (the rest predicts them).
HELD_GEMM_NK = (1536.0, 5120.0, 12288.0)
HELD_GEMM_M = (96.0, 97.0, 192.0, 193.0, 384.0, 768.0, 1536.0, 3072.0)
HELD_DECODE_KV = (64.0, 1024.0, 16384.0)
HELD_DECODE_BATCH = (8.0, 128.0)
HELD_PREFILL_ISL = (1536.0, 6144.0)
HELD_PREFILL_BATCH = (8.0, 64.0)


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Fit and hold-out errors of one operator on one GPU."""

    operator: str
    gpu: str
    dtype: str
    fit_cells: int
    fit_errors: tuple[float, ...]  # empty: exact on its own grid (a table)
    held_errors: tuple[float, ...]
    held_out: str  # what was held out


def _stats(errors: Iterable[float]) -> tuple[float, float, float]:
    a = np.array([e for e in errors if math.isfinite(e)])
    if len(a) == 0:
        return math.nan, math.nan, math.nan
    return (float(np.median(np.abs(a))), float(np.percentile(np.abs(a), 90)),
            float(np.median(a)))


# -- tables: hold-out of grid lines --------------------------------------------------------------
def gemm_rows(t: KernelTables) -> list[ErrorRow]:
    out = []
    for dtype in ("bfloat16", "fp8"):
        if not t.has_gemm(dtype):
            continue
        cells = t.gemm_cells(dtype)
        ms = t.gemm_m
        kept = {nk: row for nk, row in cells.items()
                if nk[0] not in HELD_GEMM_NK and nk[1] not in HELD_GEMM_NK}
        ns = sorted({n for n, _ in kept})
        ks = sorted({k for _, k in kept})
        nk_err: list[float] = []
        for (n, k), row in cells.items():
            if (n, k) in kept or not (ns[0] < n < ns[-1] or n in ns) or not (
                    ks[0] < k < ks[-1] or k in ks):
                continue
            curve = gemm_curve(ms, kept, ns, ks, n, k)
            nk_err += [curve.at(m) / y - 1 for m, y in zip(ms, row, strict=True) if y > 0]
        m_err: list[float] = []
        for row in cells.values():
            pts = [(m, y) for m, y in zip(ms, row, strict=True) if y > 0]
            keep = [(m, y) for m, y in pts if m not in HELD_GEMM_M]
            curve = Curve([m for m, _ in keep], [y for _, y in keep])
            m_err += [curve.at(m) / y - 1 for m, y in pts
                      if m in HELD_GEMM_M and keep[0][0] < m < keep[-1][0]]
        n_cells = sum(1 for row in kept.values() for y in row if y > 0)
        out.append(ErrorRow("GEMM (n, k lines)", t.system, dtype, n_cells, (), tuple(nk_err),
                            "n or k in 1536, 5120, 12288"))
        out.append(ErrorRow("GEMM (token counts)", t.system, dtype, n_cells, (), tuple(m_err),
                            "m in 96/97, 192/193, 384, 768, 1536, 3072"))
    return out


def attention_rows(t: KernelTables, kind: str) -> list[ErrorRow]:
    held_x = HELD_DECODE_KV if kind == "decode" else HELD_PREFILL_ISL
    held_b = HELD_DECODE_BATCH if kind == "decode" else HELD_PREFILL_BATCH
    log_x = kind == "prefill"
    out = []
    for kv in ("bfloat16", "fp8"):
        if not t.has_attention(kind, kv):
            continue
        x_err: list[float] = []
        b_err: list[float] = []
        cells = 0
        for hq, hk in t.attention_pairs(kind, kv):
            batches, xs, values = t.attention_table(kind, kv, hq, hk)
            curves: list[tuple[float, Curve]] = []
            for batch, row in zip(batches, values, strict=True):
                pts = [(x, y) for x, y in zip(xs, row, strict=True) if y > 0]
                keep = [(x, y) for x, y in pts if x not in held_x]
                cells += len(keep)
                if len(keep) < 2:
                    continue
                c = Curve([x for x, _ in keep], [y for _, y in keep], log_x=log_x)
                x_err += [c.at(x) / y - 1 for x, y in pts
                          if x in held_x and keep[0][0] < x < keep[-1][0]]
                if batch not in held_b:
                    curves.append((batch, Curve([x for x, _ in pts], [y for _, y in pts],
                                                log_x=log_x)))
            if len(curves) < 2:
                continue
            grid = Grid([b for b, _ in curves], [c for _, c in curves])
            for batch, row in zip(batches, values, strict=True):
                if batch in held_b and grid.rows[0] < batch < grid.rows[-1]:
                    b_err += [grid.at(batch, x) / y - 1 for x, y in zip(xs, row, strict=True)
                              if y > 0]
        length = "context" if kind == "decode" else "prompt length"
        out.append(ErrorRow(f"{kind} attention ({length})", t.system, kv, cells, (),
                            tuple(x_err), f"{length} in {', '.join(f'{x:g}' for x in held_x)}"))
        out.append(ErrorRow(f"{kind} attention (batch)", t.system, kv, cells, (), tuple(b_err),
                            f"batch in {', '.join(f'{b:g}' for b in held_b)}"))
    return out


def allreduce_rows(t: KernelTables) -> list[ErrorRow]:
    out = []
    for impl in ("vllm_graph", "vllm_eager"):
        err: list[float] = []
        cells = 0
        for tp in (2, 4, 8):
            pts = t.allreduce_points(impl, tp)
            if len(pts) < 3:
                continue
            keep = [p for i, p in enumerate(pts) if i % 2 == 0 or i == len(pts) - 1]
            cells += len(keep)
            curve = _loglog_curve(keep)
            err += [curve.at(x) / y - 1 for i, (x, y) in enumerate(pts)
                    if i % 2 == 1 and i != len(pts) - 1]
        if cells:
            out.append(ErrorRow(f"all-reduce ({impl})", t.system, "bfloat16", cells, (),
                                tuple(err), "every other message size, TP 2/4/8"))
    return out


def table_rows() -> list[ErrorRow]:
    rows: list[ErrorRow] = []
    for system in systems():
        t = load_tables(system)
        rows += gemm_rows(t) + attention_rows(t, "decode") + attention_rows(t, "prefill")
        rows += allreduce_rows(t)
    return rows


# -- element-wise: fitted ------------------------------------------------------------------------
def elementwise_rows(fits: list[ew.Fit], rows: dict[str, list[ew.Row]]) -> list[ErrorRow]:
    out = []
    for f in fits:
        bw = dict(ew.VIDUR_GPUS.values())[f.gpu]
        for op in (*ew.OPS, "all"):
            sub = [r for r in rows[f.gpu] if op in ("all", r.op)]
            fit = [r for r in sub if r.model != ew.HELD_OUT_MODEL]
            held = [r for r in sub if r.model == ew.HELD_OUT_MODEL]
            out.append(ErrorRow(
                f"element-wise: {op}", f.gpu, "bfloat16", len(fit),
                tuple(ew.errors(fit, bw, f.bw_efficiency, f.floor_s)),
                tuple(ew.errors(held, bw, f.bw_efficiency, f.floor_s)) if held else (),
                f"model {ew.HELD_OUT_MODEL}",
            ))
    return out


def coefficient_lines(fits: list[ew.Fit]) -> list[str]:
    """The rows of ``elementwise.csv`` (catalog GPUs, inherited ones last)."""
    by_gpu = {f.gpu: f for f in fits}
    lines = ["gpu,bw_efficiency,floor_us,source"]
    for f in fits:
        name = f.gpu.split("-")[0].upper()
        lines.append(f"{f.gpu},{f.bw_efficiency:g},{f.floor_s * 1e6:.2f},fitted: Vidur {name} "
                     "RMSNorm/rotary/SiLU-and-mul kernels")
    for gpu, (parent, why) in ew.INHERITED.items():
        p = by_gpu[parent]
        name = parent.split("-")[0].upper()
        lines.append(f"{gpu},{p.bw_efficiency:g},{p.floor_s * 1e6:.2f},{name} fit "
                     f"({why}; no {gpu} profile)")
    return lines


# -- report --------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{x * 100:.1f}%"


def markdown(rows: list[ErrorRow], fits: list[ew.Fit]) -> str:
    out = ["Generated by `python -m sim.cost.calibration.kernels --write-docs`.", "",
           "**Element-wise kernels** (fitted; `sim/data/kernels/elementwise.csv`):", "",
           "| GPU | bandwidth efficiency | floor µs | fit rows | held-out rows |",
           "|---|---|---|---|---|"]
    for f in fits:
        out.append(f"| {f.gpu} | {f.bw_efficiency:g} | {f.floor_s * 1e6:.2f} | {f.fit_rows} | "
                   f"{f.held_rows} |")
    for gpu, (parent, why) in ew.INHERITED.items():
        out.append(f"| {gpu} | (the {parent} fit: {why}) | | | |")
    out += ["", "| operator | GPU | fit rows | fit median | fit p90 | held-out rows | "
            "held-out median | held-out p90 | median signed (held out) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r.operator.startswith("element-wise")):
        fm, fp, _ = _stats(r.fit_errors)
        hm, hp, hs = _stats(r.held_errors)
        out.append(f"| {r.operator[len('element-wise: '):]} | {r.gpu} | {len(r.fit_errors)} | "
                   f"{_pct(fm)} | {_pct(fp)} | {len(r.held_errors)} | {_pct(hm)} | {_pct(hp)} | "
                   f"{_pct(hs)} |")
    out += ["", "**Measured tables** (interpolated; exact on their grid, errors between grid "
            "lines held out and predicted from the rest by the simulator's own interpolation):",
            "", "| operator | GPU | dtype | cells kept | held out | held-out cells | "
            "median | p90 | median signed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if not r.operator.startswith("element-wise")):
        hm, hp, hs = _stats(r.held_errors)
        out.append(f"| {r.operator} | {r.gpu} | {r.dtype} | {r.fit_cells} | {r.held_out} | "
                   f"{len(r.held_errors)} | {_pct(hm)} | {_pct(hp)} | {_pct(hs)} |")
    return "\n".join(out)


def write_docs(text: str, path: Path = DOCS) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no {BEGIN} … {END} section to regenerate")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))


def calibrate() -> tuple[list[ew.Fit], list[ErrorRow], list[str]]:
    """(element-wise fits, every error row, the regenerated ``elementwise.csv`` lines)."""
    fits, rows = ew.fit_all()
    return fits, elementwise_rows(fits, rows) + table_rows(), coefficient_lines(fits)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--write", action="store_true", help="regenerate elementwise.csv")
    ap.add_argument("--write-docs", action="store_true",
                    help="regenerate the calibration section of docs/cost_model.md")
    args = ap.parse_args(argv)
    fits, rows, lines = calibrate()
    text = markdown(rows, fits)
    print(text)
    shipped = COEFFICIENTS.read_text().splitlines()
    if args.write or args.write_docs:
        COEFFICIENTS.write_text("\n".join(lines) + "\n")
        if args.write_docs:
            write_docs(text)
    elif shipped != lines:
        print(f"\nnote: {COEFFICIENTS} differs from this fit; --write regenerates it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
