"""The aiconfigurator table extraction's shared parts: picking a vLLM table, pivoting it wide,
rounding, and writing the tables with their provenance (``coverage.csv``).

Used by ``sim/cost/calibration/aic_extract.py`` (GEMM, attention, collectives) and
``sim/cost/calibration/aic_moe_mla.py`` (fused MoE, MLA).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def sig4(x: float) -> float:
    """Round to 4 significant digits (the tables' precision)."""
    if not np.isfinite(x) or x == 0:
        return x
    return float(f"{x:.4g}")


def vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in v.split("."))


def pick(data: Path, gpu: str, op: str, fname: str, version: str,
         newest_not_after: bool = False) -> tuple[str, str] | None:
    """(path, version) of a vLLM table: the exact version, or (comm) the newest not newer."""
    cands = sorted(glob.glob(str(data / gpu / op / "vllm" / "*" / fname)))
    if not cands:
        return None
    by_v = {Path(c).parent.name: c for c in cands}
    if version in by_v:
        return by_v[version], version
    if newest_not_after:
        ok = [v for v in by_v if vkey(v) <= vkey(version)] or list(by_v)
        v = max(ok, key=vkey)
        return by_v[v], v
    return None


def wide(df: Any, index: list[str], col: str, prefix: str) -> Any:
    t = df.pivot_table(index=index, columns=col, values="latency_us", aggfunc="median")
    t.columns = [f"{prefix}{int(c)}_us" for c in t.columns]
    return t.reset_index()


class Writer:
    """Collects table parts and their provenance, writes them at the end."""

    def __init__(self, out: Path, root: Path) -> None:
        self.out = out
        self.root = root
        self.tables: dict[str, list[Any]] = {}
        self.coverage: list[dict[str, Any]] = []

    def rel(self, path: str) -> str:
        return "aiconfigurator_core/" + os.path.relpath(path, self.root.parent)

    def add(self, name: str, df: Any, gpu: str, source: str, version: str, rows_read: int,
            **extra: object) -> None:
        if df.empty:
            return
        self.tables.setdefault(name, []).append(df)
        self.coverage.append(dict(gpu=gpu, table=name, source=self.rel(source), version=version,
                                  rows_read=rows_read, rows_written=len(df), **extra))

    def flush(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for name, parts in self.tables.items():
            df = pd.concat(parts, ignore_index=True)
            keys = [c for c in df.columns if not c.endswith("_us")]
            grid = sorted((c for c in df.columns if c.endswith("_us") and c != "latency_us"),
                          key=lambda c: int("".join(ch for ch in c[:-3] if ch.isdigit())))
            rest = [c for c in df.columns if c == "latency_us"]
            df = df[keys + grid + rest]
            num = df.select_dtypes("float").columns
            df[num] = df[num].map(sig4)
            df.to_csv(self.out / f"{name}.csv", index=False)
        pd.DataFrame(self.coverage).to_csv(self.out / "coverage.csv", index=False)
