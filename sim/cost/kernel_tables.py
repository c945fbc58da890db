"""The measured vLLM kernel tables shipped with twinserve, and curves built from them.

The tables (``sim/data/kernels/aiconfigurator/``, derived from aiconfigurator-core 0.12.0's
database; NOTICE there) hold kernel times measured through vLLM's own layers under CUDA-graph
replay: GEMMs by (dtype, m, n, k), prefill and decode attention by (KV dtype, head size,
heads, batch, length), vLLM's tensor-parallel all-reduce by (TP, bytes, graph
or eager), NCCL collectives, the fused-MoE layer by (dtype, shape, MoE TP/EP, tokens) and
DeepSeek's MLA attention module by (KV dtype, GEMM dtype, heads, batch, length).
``load_tables(system)`` reads one GPU's rows once per process; the ``*_curve`` / ``*_grid``
methods turn them into the ``sim.cost.interp`` curves a cost model evaluates per step.

Interpolation (chosen on held-out grid lines, docs/cost_model.md §4):

* GEMM — linear in the token count m between measured points (the tables resolve the tile
  boundaries m = 16j / 16j + 1, so the steps stay), log-bilinear in the output and input
  features (n, k); beyond the largest n or k the time grows in proportion.
* Decode attention — linear in the context length and in the batch.
* Prefill attention — log-log in the prompt length, linear in the batch; beyond 16384 tokens
  the time grows quadratically (causal attention's FLOPs).
* All-reduce and all-gather — log-log in the message size.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from engine.core.config import ConfigError
from sim.cost.interp import Curve, Grid

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "kernels" / "aiconfigurator"

GEMM_DTYPES = ("bfloat16", "fp8")
KV_DTYPES = ("bfloat16", "fp8")
ATTENTION_KINDS = ("decode", "prefill")
#: Wide-column prefixes of the tables: the grid value follows, then ``_us``.
_PREFIX = {"gemm": "m", "decode": "kv", "prefill": "isl", "moe": "t"}
#: An attention table's key: (kind, KV dtype, head size, query heads, KV heads).
AttnKey = tuple[str, str, int, int, int]


@dataclass(frozen=True, slots=True)
class MoEShape:
    """A fused-MoE layer's shape as the tables key it."""

    hidden: int
    inter: int  # one expert's width (before MoE TP)
    topk: int
    experts: int


@dataclass(frozen=True, slots=True)
class TableSource:
    """Where one table of one GPU comes from (``coverage.csv``)."""

    table: str
    dtype: str
    version: str  # vLLM version the kernels were measured with
    kernel: str


@dataclass(frozen=True, slots=True)
class AttentionGrid:
    """Attention time (µs) by (batch, length) for a model's per-GPU head counts."""

    grid: Grid
    how: str  # "measured (Hq, Hk)", "between (…) and (…)" or "scaled from (…)"


def _grid_columns(header: list[str], prefix: str) -> list[tuple[int, float]]:
    """(column index, grid value) of the wide columns ``<prefix><value>_us``, ascending."""
    out = []
    for i, name in enumerate(header):
        if name.startswith(prefix) and name.endswith("_us"):
            body = name[len(prefix) : -3]
            if body.isdigit():
                out.append((i, float(body)))
    return sorted(out, key=lambda c: c[1])


def _value(text: str) -> float:
    return float(text) if text else math.nan


def _read(name: str, system: str) -> tuple[list[str], list[list[str]]]:
    """The header of table ``name`` and the rows of GPU ``system`` (its first column). The
    other GPUs' lines are skipped before they are parsed: a run reads one GPU of six."""
    lines = (DATA_DIR / name).read_text(encoding="utf-8").splitlines()
    prefix = f"{system},"
    header, *rows = csv.reader([lines[0], *(line for line in lines if line.startswith(prefix))])
    return header, rows  # (an unquoted first field: each row's is ``system``)


def _read_records(name: str, system: str) -> list[dict[str, str]]:
    """``_read``'s rows as records keyed by the header's names."""
    header, rows = _read(name, system)
    return [dict(zip(header, r, strict=True)) for r in rows]


def systems() -> tuple[str, ...]:
    """The GPUs (aiconfigurator system names) the shipped tables cover."""
    return _systems()


@lru_cache(maxsize=1)
def _systems() -> tuple[str, ...]:
    with (DATA_DIR / "coverage.csv").open(newline="") as f:
        return tuple(sorted({r["gpu"] for r in csv.DictReader(f) if r["table"] == "gemm"}))


class KernelTables:
    """One GPU's measured kernel tables."""

    def __init__(self, system: str) -> None:
        if system not in systems():
            raise ConfigError(
                f"no measured kernel tables for GPU system {system!r}; "
                f"shipped: {', '.join(systems())}"
            )
        self.system = system
        self.sources = self._read_sources()
        self._read_gemm()
        self._attention: dict[AttnKey, tuple[list[float], list[list[float]]]] = {}
        self._attention_x: dict[str, list[float]] = {}
        for kind in ATTENTION_KINDS:
            self._read_attention(kind)
        self._read_comm()
        self._read_moe()
        self._mla: dict[tuple[str, str, str, int], tuple[list[float], list[list[float]]]] = {}
        self._mla_x: dict[str, list[float]] = {}
        for kind in ATTENTION_KINDS:
            self._read_mla(kind)

    # -- reading ------------------------------------------------------------------------------
    def _read_sources(self) -> dict[tuple[str, str], TableSource]:
        out = {}
        with (DATA_DIR / "coverage.csv").open(newline="") as f:
            for r in csv.DictReader(f):
                if r["gpu"] == self.system:
                    src = TableSource(r["table"], r["dtype"], r["version"], r["kernel"])
                    out[(src.table, src.dtype)] = src
        return out

    def _read_gemm(self) -> None:
        header, rows = _read("gemm.csv", self.system)
        cols = _grid_columns(header, _PREFIX["gemm"])
        self.gemm_m = [m for _, m in cols]
        self._gemm: dict[str, dict[tuple[float, float], list[float]]] = {}
        for r in rows:
            dtype, n, k = r[1], float(r[2]), float(r[3])
            self._gemm.setdefault(dtype, {})[(n, k)] = [_value(r[i]) for i, _ in cols]
        self._gemm_n: dict[str, list[float]] = {}
        self._gemm_k: dict[str, list[float]] = {}
        for dtype, cells in self._gemm.items():
            self._gemm_n[dtype] = sorted({n for n, _ in cells})
            self._gemm_k[dtype] = sorted({k for _, k in cells})

    def _read_attention(self, kind: str) -> None:
        header, rows = _read(f"attn_{kind}.csv", self.system)
        cols = _grid_columns(header, _PREFIX[kind])
        self._attention_x[kind] = [x for _, x in cols]
        by_pair: dict[AttnKey, list[tuple[float, list[float]]]] = {}
        for r in rows:
            kv_dtype, head_dim, hq, hk, batch = r[1], int(r[2]), int(r[3]), int(r[4]), float(r[5])
            values = [_value(r[i]) for i, _ in cols]
            key = (kind, kv_dtype, head_dim, hq, hk)
            by_pair.setdefault(key, []).append((batch, values))
        for key, entries in by_pair.items():
            entries.sort(key=lambda e: e[0])
            self._attention[key] = ([b for b, _ in entries], [v for _, v in entries])

    def _read_comm(self) -> None:
        self._allreduce: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for r in _read_records("allreduce.csv", self.system):
            self._allreduce.setdefault((r["impl"], int(r["tp"])), []).append(
                (float(r["bytes"]), float(r["latency_us"]))
            )
        self._collectives: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for r in _read_records("nccl_collectives.csv", self.system):
            self._collectives.setdefault((r["op"], int(r["tp"])), []).append(
                (float(r["bytes"]), float(r["latency_us"]))
            )

    # -- GEMM ---------------------------------------------------------------------------------
    def has_gemm(self, dtype: str) -> bool:
        return dtype in self._gemm

    def gemm_cells(self, dtype: str) -> dict[tuple[float, float], list[float]]:
        """The measured (n, k) -> times over ``gemm_m`` (µs; NaN where not measured)."""
        return self._gemm[dtype]

    def gemm_curve(self, dtype: str, n: float, k: float) -> Curve:
        """GEMM time (µs) by token count for an ``n``-output, ``k``-input weight."""
        if dtype not in self._gemm:
            raise ConfigError(f"no {dtype} GEMM table for {self.system}")
        return gemm_curve(self.gemm_m, self._gemm[dtype], self._gemm_n[dtype],
                          self._gemm_k[dtype], n, k)

    # -- attention ----------------------------------------------------------------------------
    def has_attention(self, kind: str, kv_dtype: str) -> bool:
        return any(key[0] == kind and key[1] == kv_dtype for key in self._attention)

    def attention_pairs(self, kind: str, kv_dtype: str,
                        head_dim: int = 128) -> list[tuple[int, int]]:
        """The measured (query heads, KV heads) pairs at this head size."""
        return sorted((k[3], k[4]) for k in self._attention if k[:3] == (kind, kv_dtype, head_dim))

    def attention_table(
        self, kind: str, kv_dtype: str, hq: int, hk: int, head_dim: int = 128
    ) -> tuple[list[float], list[float], list[list[float]]]:
        """(batches, lengths, times µs) of one measured head pair."""
        batches, values = self._attention[(kind, kv_dtype, head_dim, hq, hk)]
        return batches, self._attention_x[kind], values

    def attention_grid(self, kind: str, kv_dtype: str, hq: int, hk: int,
                       head_dim: int = 128) -> AttentionGrid:
        """Attention time (µs) by (batch, length) for ``hq`` query and ``hk`` KV heads per GPU
        of ``head_dim``.

        Measured pairs are used as they are. Otherwise, between two measured pairs with the
        same KV heads the time is interpolated linearly in the query heads; failing that, the
        nearest measured pair is scaled above its floor by the work ratio (decode: KV heads,
        which set the bytes read; prefill: query heads, which set the FLOPs). A head size
        without measurements uses the head-size-128 pairs scaled by the head-size ratio (an
        estimate).
        """
        if not self.has_attention(kind, kv_dtype):
            raise ConfigError(f"no {kind} attention table with {kv_dtype} KV for {self.system}")
        if self.attention_pairs(kind, kv_dtype, head_dim):
            got = self._pair_grid(kind, kv_dtype, hq, hk, head_dim, 1.0)
            size = f", head size {head_dim}" if head_dim != 128 else ""
            return AttentionGrid(got.grid, got.how + size)
        scale = head_dim / 128
        got = self._pair_grid(kind, kv_dtype, hq, hk, 128, scale)
        return AttentionGrid(got.grid, f"{got.how}, scaled by head size {scale:g} (estimate)")

    def _pair_grid(self, kind: str, kv_dtype: str, hq: int, hk: int, head_dim: int,
                   work: float) -> AttentionGrid:
        pairs = self.attention_pairs(kind, kv_dtype, head_dim)
        exponent = 2.0 if kind == "prefill" else 1.0
        log_x = kind == "prefill"
        table = (kind, kv_dtype, head_dim)
        if (hq, hk) in pairs and work == 1.0:
            return AttentionGrid(self._grid(table, (hq, hk), log_x, exponent),
                                 f"measured ({hq}, {hk})")
        same_kv = [p for p in pairs if p[1] == hk]
        lower = [p for p in same_kv if p[0] <= hq]
        upper = [p for p in same_kv if p[0] >= hq]
        if lower and upper:
            lo, hi = max(lower), min(upper)
            w = 0.0 if hi == lo else (hq - lo[0]) / (hi[0] - lo[0])
            how = (f"measured ({hq}, {hk})" if lo == hi
                   else f"between ({lo[0]}, {lo[1]}) and ({hi[0]}, {hi[1]})")
            return AttentionGrid(self._blend(table, lo, hi, w, work, log_x, exponent), how)
        near = min(pairs, key=lambda p: (abs(math.log(p[1] / hk)), abs(math.log(p[0] / hq))))
        ratio = hk / near[1] if kind == "decode" else hq / near[0]
        return AttentionGrid(
            self._blend(table, near, near, 0.0, ratio * work, log_x, exponent),
            f"scaled from ({near[0]}, {near[1]}) by {ratio:g} (estimate)",
        )

    def _grid(self, table: tuple[str, str, int], pair: tuple[int, int], log_x: bool,
              exponent: float) -> Grid:
        kind, kv_dtype, head_dim = table
        batches, xs, values = self.attention_table(kind, kv_dtype, *pair, head_dim)
        return _grid_from(batches, xs, values, log_x, exponent)

    def _blend(self, table: tuple[str, str, int], a: tuple[int, int], b: tuple[int, int],
               w: float, scale: float, log_x: bool, exponent: float) -> Grid:
        """(1 - w)·a + w·b, with the part above the smallest time scaled by ``scale``."""
        kind, kv_dtype, head_dim = table
        ba, xs, va = self.attention_table(kind, kv_dtype, *a, head_dim)
        bb, _, vb = self.attention_table(kind, kv_dtype, *b, head_dim)
        batches = [x for x in ba if x in bb]
        values = []
        for batch in batches:
            ra, rb = va[ba.index(batch)], vb[bb.index(batch)]
            values.append([(1 - w) * p + w * q for p, q in zip(ra, rb, strict=True)])
        floor = min(v for row in values for v in row if math.isfinite(v))
        values = [[floor + (v - floor) * scale for v in row] for row in values]
        return _grid_from(batches, xs, values, log_x, exponent)

    # -- fused MoE ----------------------------------------------------------------------------
    def _read_moe(self) -> None:
        header, rows = _read("moe.csv", self.system)
        cols = _grid_columns(header, _PREFIX["moe"])
        self._moe_x = [x for _, x in cols]
        self._moe: dict[tuple[str, MoEShape, int, int], list[tuple[float, float]]] = {}
        for r in rows:
            dtype = r[1]
            shape = MoEShape(int(r[3]), int(r[4]), int(r[5]), int(r[6]))
            key = (dtype, shape, int(r[7]), int(r[8]))
            points = [(x, _value(r[i])) for (i, _), x in zip(cols, self._moe_x, strict=True)]
            self._moe[key] = [(x, y) for x, y in points if y > 0]

    def moe_shapes(self, dtype: str) -> list[MoEShape]:
        """The shapes measured in ``dtype`` (any MoE TP/EP)."""
        return sorted({k[1] for k in self._moe if k[0] == dtype},
                      key=lambda s: (s.hidden, s.inter, s.topk, s.experts))

    def moe_layouts(self, dtype: str, shape: MoEShape) -> list[tuple[int, int]]:
        """The (MoE TP, MoE EP) pairs measured for ``shape`` in ``dtype``."""
        return sorted((k[2], k[3]) for k in self._moe if k[0] == dtype and k[1] == shape)

    def moe_curve(self, dtype: str, shape: MoEShape, moe_tp: int, moe_ep: int) -> Curve | None:
        """One rank's fused-MoE layer time (µs) by the tokens routed over all experts (linear
        between measured token counts, proportional beyond), or None when not measured."""
        points = self._moe.get((dtype, shape, moe_tp, moe_ep))
        if not points:
            return None
        return Curve([x for x, _ in points], [y for _, y in points])

    # -- MLA attention module -----------------------------------------------------------------
    def _read_mla(self, kind: str) -> None:
        header, rows = _read(f"mla_{kind}.csv", self.system)
        cols = _grid_columns(header, _PREFIX[kind])
        self._mla_x[kind] = [x for _, x in cols]
        by: dict[tuple[str, str, str, int], list[tuple[float, list[float]]]] = {}
        for r in rows:
            key = (kind, r[1], r[2], int(r[3]))
            by.setdefault(key, []).append((float(r[4]), [_value(r[i]) for i, _ in cols]))
        for key, entries in by.items():
            entries.sort(key=lambda e: e[0])
            self._mla[key] = ([b for b, _ in entries], [v for _, v in entries])

    def mla_heads(self, kind: str, kv_dtype: str, gemm_dtype: str) -> list[int]:
        return sorted(k[3] for k in self._mla if k[:3] == (kind, kv_dtype, gemm_dtype))

    def mla_grid(self, kind: str, kv_dtype: str, gemm_dtype: str, heads: int) -> Grid | None:
        """DeepSeek-V3's MLA attention module time (µs) by (batch, length) at ``heads`` query
        heads per GPU (interpolated linearly between measured head counts), or None."""
        measured = self.mla_heads(kind, kv_dtype, gemm_dtype)
        lower = [h for h in measured if h <= heads]
        upper = [h for h in measured if h >= heads]
        if not lower or not upper:
            return None
        lo, hi = max(lower), min(upper)
        w = 0.0 if hi == lo else (heads - lo) / (hi - lo)
        ba, va = self._mla[(kind, kv_dtype, gemm_dtype, lo)]
        bb, vb = self._mla[(kind, kv_dtype, gemm_dtype, hi)]
        batches = [b for b in ba if b in bb]
        values = [[(1 - w) * p + w * q for p, q in
                   zip(va[ba.index(b)], vb[bb.index(b)], strict=True)] for b in batches]
        prefill = kind == "prefill"
        return _grid_from(batches, self._mla_x[kind], values, prefill, 2.0 if prefill else 1.0)

    # -- communication ------------------------------------------------------------------------
    def has_allreduce(self, tp: int) -> bool:
        return ("vllm_graph", tp) in self._allreduce

    def allreduce_points(self, impl: str, tp: int) -> list[tuple[float, float]]:
        return sorted(self._allreduce.get((impl, tp), []))

    def allreduce_curve(self, tp: int, graph: bool) -> Curve:
        """vLLM's TP all-reduce time (µs) by message bytes, in a CUDA graph or eager."""
        impl = "vllm_graph" if graph else "vllm_eager"
        points = self.allreduce_points(impl, tp)
        if not points:
            raise ConfigError(f"no measured {impl} all-reduce at TP {tp} on {self.system}")
        return _loglog_curve(points)

    def collective_curve(self, op: str, tp: int) -> Curve | None:
        """NCCL ``op`` (all_gather, reduce_scatter, alltoall) time (µs) by bytes, if measured."""
        points = sorted(self._collectives.get((op, tp), []))
        return _loglog_curve(points) if points else None


@cache
def load_tables(system: str) -> KernelTables:
    """The tables of ``system``, read once per process."""
    return KernelTables(system)


def _loglog_curve(points: list[tuple[float, float]]) -> Curve:
    xs: list[float] = []
    ys: list[float] = []
    for x, y in points:
        if xs and x <= xs[-1]:
            continue
        xs.append(x)
        ys.append(y)
    return Curve(xs, ys, log_x=True)


def _grid_from(batches: list[float], xs: list[float], values: list[list[float]], log_x: bool,
               exponent: float) -> Grid:
    rows: list[float] = []
    curves: list[Curve] = []
    for batch, row in zip(batches, values, strict=True):
        pts = [(x, v) for x, v in zip(xs, row, strict=True) if math.isfinite(v) and v > 0]
        if pts:
            rows.append(batch)
            curves.append(Curve([p[0] for p in pts], [p[1] for p in pts], log_x=log_x,
                                exponent=exponent))
    return Grid(rows, curves)


def _bracket(grid: list[float], v: float) -> tuple[float, float, float, float]:
    """(lower, upper, log weight, scale) of ``v`` on ``grid``; outside it the edge value with
    a proportional scale above the grid (and none below: a kernel's floor)."""
    if v <= grid[0]:
        return grid[0], grid[0], 0.0, 1.0
    if v >= grid[-1]:
        return grid[-1], grid[-1], 0.0, v / grid[-1]
    j = 1
    while grid[j] < v:
        j += 1
    lo, hi = grid[j - 1], grid[j]
    if v == hi:
        return hi, hi, 0.0, 1.0
    return lo, hi, math.log(v / lo) / math.log(hi / lo), 1.0


def gemm_curve(
    ms: list[float],
    cells: dict[tuple[float, float], list[float]],
    ns: list[float],
    ks: list[float],
    n: float,
    k: float,
) -> Curve:
    """The m-curve of an (n, k) GEMM from measured (n, k) cells: log-bilinear in (n, k) at every
    m all four corners measured, proportional beyond the largest n or k."""
    n0, n1, wn, sn = _bracket(ns, n)
    k0, k1, wk, sk = _bracket(ks, k)
    corners = (
        ((n0, k0), (1 - wn) * (1 - wk)),
        ((n1, k0), wn * (1 - wk)),
        ((n0, k1), (1 - wn) * wk),
        ((n1, k1), wn * wk),
    )
    xs: list[float] = []
    ys: list[float] = []
    for i, m in enumerate(ms):
        log_t = 0.0
        ok = True
        for key, weight in corners:
            cell = cells.get(key)
            value = cell[i] if cell is not None else math.nan
            if not (value > 0.0):  # NaN: not measured at this m
                ok = False
                break
            log_t += weight * math.log(value)
        if ok:
            xs.append(m)
            ys.append(math.exp(log_t) * sn * sk)
    if not xs:
        raise ConfigError(f"no measured GEMM near n={n:g}, k={k:g}")
    return Curve(xs, ys)
