"""A run's tables as numpy columns: what reports compute from, without importing pandas.

``reports.tables`` builds a run's three tables as ``ColumnTable``s (``RunColumns``); the
summary, the breakdown, the engine statistics and the diagnosis read them column by column,
and ``reports.run_dir`` writes them to Parquet through pyarrow. Importing pandas costs more CPU
than summarising a 10,000-request run, so the path from an event log to a run directory never
needs it. ``RunColumns.to_frames()`` gives the same tables as pandas DataFrames (for plots,
CSV files and users), and ``as_columns`` turns DataFrames (a loaded run directory) back into
columns, so every metric has one implementation.

A column is one of three kinds, each with the pandas dtype it stands for:

* a numpy array: numbers and flags as they are; text (``object`` dtype) is pandas' ``str``;
* ``Labels``: codes into a few categories (pandas' ``Categorical``);
* ``OptionalInts``: integers that may be missing, held as floats with NaN (pandas' ``Int64``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: The dtype of a label column's categories as pandas holds them: ``str`` (built from a list
#: of strings) or ``object`` (built from an object Index). Kept so that the DataFrames and the
#: Parquet files (``string`` or ``large_string`` dictionaries) stay what they have been.
CategoriesDtype = Literal["str", "object"]


@dataclass(frozen=True, eq=False)
class Labels:
    """A text column as small integer codes into ``categories`` (code -1: missing).

    The codes have pandas' width for that many categories (``code_dtype``), so a table
    converts to a DataFrame and to Parquet without re-coding."""

    codes: np.ndarray
    categories: tuple[str, ...]
    categories_dtype: CategoriesDtype = "str"

    def __post_init__(self) -> None:
        if self.codes.dtype != code_dtype(len(self.categories)):
            object.__setattr__(self, "codes",
                               self.codes.astype(code_dtype(len(self.categories))))

    @classmethod
    def sorted_from(cls, values: Sequence[str]) -> Labels:
        """Labels of ``values`` (no missing ones) with their distinct values sorted, as
        ``pd.Categorical(values)`` codes them (no values: no categories, of dtype object, as
        pandas infers it); a few distinct values repeated many times are coded in C, not one
        string at a time."""
        categories = sorted(set(values))
        code_of = {v: i for i, v in enumerate(categories)}
        codes = np.fromiter(map(code_of.__getitem__, values), dtype=np.int32, count=len(values))
        return cls(codes, tuple(categories), "str" if categories else "object")

    @classmethod
    def in_order_of_appearance(cls, values: Sequence[object]) -> Labels:
        """Labels of ``values`` (None and NaN missing) with their distinct values in the order
        they first come, categories of dtype object, as ``pd.factorize`` codes them; coded in
        C (``dict.fromkeys``, ``map``), not one value at a time."""
        code_of: dict[object, int] = {}
        categories: list[str] = []
        for v in dict.fromkeys(values):
            missing = v is None or v != v  # NaN is not equal to itself
            code_of[v] = -1 if missing else len(categories)
            if not missing:
                categories.append(str(v))
        codes = np.fromiter(map(code_of.__getitem__, values), np.int64, len(values))
        return cls(codes, tuple(categories), "object")

    def __len__(self) -> int:
        return len(self.codes)

    def strings(self, missing: str | None = "") -> np.ndarray:
        """The values as an object array of ``str`` (``missing`` where there is none)."""
        table = np.array([*self.categories, missing], dtype=object)
        return table[self.codes.astype(np.int64) % (len(self.categories) + 1)]

    def code_of(self, value: str) -> int:
        """The code of ``value``, or -2 (no row has it; -1 marks missing rows)."""
        return self.categories.index(value) if value in self.categories else -2

    def counts(self) -> np.ndarray:
        """Rows per category (missing rows not counted)."""
        codes = self.codes[self.codes >= 0].astype(np.int64)
        return np.bincount(codes, minlength=len(self.categories))

    def first_appearance(self) -> np.ndarray:
        """The codes present, in the order their first rows come (pandas' ``factorize``)."""
        codes = self.codes[self.codes >= 0]
        present, first_row = np.unique(codes, return_index=True)
        return present[np.argsort(first_row, kind="stable")].astype(np.int64)

    def take(self, rows: np.ndarray) -> Labels:
        return Labels(self.codes[rows], self.categories, self.categories_dtype)


@dataclass(frozen=True, eq=False)
class OptionalInts:
    """Integers some rows lack, as float64 with NaN where missing (pandas' ``Int64``)."""

    values: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    def numbers(self) -> np.ndarray:
        """The values as int64 if none is missing (they can index), else as they are."""
        values = self.values
        return values if np.isnan(values).any() else values.astype(np.int64)

    def take(self, rows: np.ndarray) -> OptionalInts:
        return OptionalInts(self.values[rows])


Column = np.ndarray | Labels | OptionalInts


def code_dtype(num_categories: int) -> np.dtype[Any]:
    """The narrowest signed integer that codes ``num_categories`` categories and -1, as pandas
    chooses it for a ``Categorical``'s codes."""
    for dtype in (np.int8, np.int16, np.int32):
        if num_categories < np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


@dataclass(frozen=True, eq=False)
class ColumnTable:
    """Named columns of one length, in order. Read numbers with ``array``, text with
    ``labels``; a table never changes once built."""

    columns: Mapping[str, Column]

    def __post_init__(self) -> None:
        lengths = {name: len(col) for name, col in self.columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of different lengths: {lengths}")

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def array(self, name: str, dtype: Any = None) -> np.ndarray:
        """A numeric, flag or text column as a numpy array (a view where it can be);
        ``OptionalInts`` as int64 where none is missing, else as floats with NaN. A ``Labels``
        column is read with ``labels``."""
        col = self.columns[name]
        if isinstance(col, Labels):
            raise TypeError(f"column {name!r} holds labels: read it with labels()")
        values = col.numbers() if isinstance(col, OptionalInts) else col
        return values if dtype is None else values.astype(dtype, copy=False)

    def labels(self, name: str) -> Labels:
        """A text column as ``Labels`` (an object column is coded on the fly, None missing)."""
        col = self.columns[name]
        if isinstance(col, Labels):
            return col
        if isinstance(col, np.ndarray) and col.dtype == object:
            return Labels.in_order_of_appearance(col.tolist())
        raise TypeError(f"column {name!r} is not text")

    def take(self, rows: np.ndarray) -> ColumnTable:
        """The rows ``rows`` selects (a boolean mask or indices), in order."""
        return ColumnTable({name: col.take(rows) if not isinstance(col, np.ndarray)
                            else col[rows] for name, col in self.columns.items()})


@dataclass(frozen=True, eq=False)
class RunTables:
    """A run's per-request, per-step and per-token-run tables as DataFrames (the invariants
    are ``reports.tables``'; ``RunColumns.to_frames()`` builds them, ``as_columns`` reads
    them back as columns)."""

    requests: pd.DataFrame  # one row per request
    steps: pd.DataFrame  # one row per engine step, + delivered_time_s
    token_runs: pd.DataFrame  # req_index, first_step, num_tokens


@dataclass(frozen=True, eq=False)
class RunColumns:
    """A run's per-request, per-step and per-token-run tables as columns (the invariants
    are ``reports.tables``')."""

    requests: ColumnTable
    steps: ColumnTable
    token_runs: ColumnTable

    def to_frames(self) -> RunTables:
        """The same tables as pandas DataFrames (imports pandas)."""
        return RunTables(*(to_frame(t) for t in (self.requests, self.steps, self.token_runs)))


def to_frame(table: ColumnTable) -> pd.DataFrame:
    """``table`` as a DataFrame of the dtypes its columns stand for (see the module)."""
    import pandas as pd

    data: dict[str, Any] = {}
    for name, col in table.columns.items():
        if isinstance(col, Labels):
            data[name] = pd.Categorical.from_codes(
                col.codes, categories=pd.Index(list(col.categories), dtype=col.categories_dtype))
        elif isinstance(col, OptionalInts):
            data[name] = pd.array(col.values, dtype="Int64")
        elif col.dtype == object:
            data[name] = pd.array(col, dtype="str")
        else:
            data[name] = col
    # fresh arrays: without copy=False pandas would consolidate the float columns into one
    # 2-D block, a transient second copy of the table (≈ 0.3 GB at a million requests)
    return pd.DataFrame(data, copy=False)


def as_columns(tables: RunTables | RunColumns) -> RunColumns:
    """``tables`` as columns: as they are, or read out of DataFrames (views where the
    DataFrame's columns are numpy arrays)."""
    if isinstance(tables, RunColumns):
        return tables
    return RunColumns(*(frame_columns(df) for df in
                        (tables.requests, tables.steps, tables.token_runs)))


def as_frames(tables: RunTables | RunColumns) -> RunTables:
    """``tables`` as DataFrames: as they are, or converted from columns (imports pandas)."""
    return tables.to_frames() if isinstance(tables, RunColumns) else tables


def frame_columns(df: pd.DataFrame) -> ColumnTable:
    """A DataFrame's columns as a ``ColumnTable``, to compute from (the inverse of
    ``to_frame`` on the frames it builds). pandas' nullable dtypes (``dtype_backend=
    "numpy_nullable"``) read as numpy: integers as ``OptionalInts``, floats with NaN, flags
    with False for missing."""
    import pandas as pd

    out: dict[str, Column] = {}
    for name, series in df.items():
        dtype = series.dtype
        if isinstance(dtype, pd.CategoricalDtype):
            cats = dtype.categories
            out[str(name)] = Labels(
                series.cat.codes.to_numpy(), tuple(str(c) for c in cats),
                "object" if cats.dtype == object else "str")
        elif dtype.kind == "O" or isinstance(dtype, pd.StringDtype):
            out[str(name)] = series.to_numpy(dtype=object)
        elif not isinstance(dtype, pd.api.extensions.ExtensionDtype):
            out[str(name)] = series.to_numpy()
        elif dtype.kind in "iu":
            out[str(name)] = OptionalInts(series.to_numpy(np.float64, na_value=np.nan))
        elif dtype.kind == "f":
            out[str(name)] = series.to_numpy(np.float64, na_value=np.nan)
        elif dtype.kind == "b":
            out[str(name)] = series.to_numpy(bool, na_value=False)
        else:
            raise TypeError(f"column {name!r}: no numpy form for dtype {dtype}")
    return ColumnTable(out)

