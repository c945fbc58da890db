"""Parquet files of a run's tables that pandas reads back as the tables' DataFrames.

``write_parquet`` writes a ``ColumnTable`` as the file ``DataFrame.to_parquet`` would write
for ``to_frame(table)``, byte for byte (tests hold the two against each other): the same Arrow
types and the same ``pandas`` schema metadata, with which ``pd.read_parquet`` restores the
columns' dtypes (``Int64``, categories, ``str``). It is built from the numpy columns directly,
so writing a run directory does not import pandas. ``write_frame_parquet`` writes a DataFrame
(a loaded run directory's table, whatever its dtypes) through pyarrow's own pandas conversion.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from reports.columns import Column, ColumnTable, Labels, OptionalInts

if TYPE_CHECKING:
    import pandas as pd

#: Rows per Parquet row group. A column table's numbers are handed to Arrow as they are (no
#: copy; text, labels and optional integers are converted once, column by column), and a
#: DataFrame is converted one row group at a time, so writing a million-request run never
#: holds a second, Arrow copy of a whole table.
PARQUET_ROW_GROUP_ROWS = 131_072

#: pandas' ``pandas_type`` of the Arrow types the tables hold (pyarrow's logical type names).
_PANDAS_TYPES: dict[pa.DataType, str] = {
    pa.bool_(): "bool", pa.int8(): "int8", pa.int16(): "int16", pa.int32(): "int32",
    pa.int64(): "int64", pa.float32(): "float32", pa.float64(): "float64",
}


def write_parquet(path: Path, table: ColumnTable) -> None:
    """``table`` as Parquet, in row groups of at most ``PARQUET_ROW_GROUP_ROWS`` rows.

    Dictionary encoding is used for the label columns only: on the float and id columns
    (pyarrow's default) it costs ≈ 4x the write time and makes the file larger."""
    schema = arrow_schema(table)
    arrays = [_arrow_array(col, field.type)
              for col, field in zip(table.columns.values(), schema, strict=True)]
    dictionary = [name for name, col in table.columns.items() if isinstance(col, Labels)]
    with pq.ParquetWriter(path, schema, use_dictionary=dictionary) as writer:
        for start in range(0, max(len(table), 1), PARQUET_ROW_GROUP_ROWS):
            part = [a.slice(start, PARQUET_ROW_GROUP_ROWS) for a in arrays]
            writer.write_table(pa.Table.from_arrays(part, schema=schema))


def write_frame_parquet(path: Path, df: pd.DataFrame) -> None:
    """``df`` as Parquet (no index), converted by pyarrow and written in row groups of at
    most ``PARQUET_ROW_GROUP_ROWS`` rows; reads back equal to ``df.reset_index(drop=True)``.

    Each slice is converted in this thread (``nthreads=1``): for numeric columns and a few
    categoricals the hand-offs to pyarrow's thread pool cost more CPU than they spread.
    Dictionary encoding is used for the categorical columns only, as ``write_parquet`` does."""
    import pandas as pd

    first = pa.Table.from_pandas(df.iloc[:PARQUET_ROW_GROUP_ROWS], preserve_index=False,
                                 nthreads=1)
    dictionary = [str(c) for c, t in df.dtypes.items() if isinstance(t, pd.CategoricalDtype)]
    with pq.ParquetWriter(path, first.schema, use_dictionary=dictionary) as writer:
        writer.write_table(first)
        del first
        for start in range(PARQUET_ROW_GROUP_ROWS, len(df), PARQUET_ROW_GROUP_ROWS):
            part = df.iloc[start : start + PARQUET_ROW_GROUP_ROWS]
            writer.write_table(pa.Table.from_pandas(part, schema=writer.schema,
                                                    preserve_index=False, nthreads=1))


def arrow_schema(table: ColumnTable) -> pa.Schema:
    """The Arrow schema of ``table``, with the ``pandas`` metadata ``from_pandas`` writes."""
    fields = [pa.field(name, _arrow_type(col)) for name, col in table.columns.items()]
    columns = [_pandas_column(name, col, f.type)
               for (name, col), f in zip(table.columns.items(), fields, strict=True)]
    pandas = {
        "index_columns": [], "column_indexes": [], "columns": columns, "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": _pandas_version(),
    }
    return pa.schema(fields, metadata={b"pandas": json.dumps(pandas).encode("utf8")})


def _arrow_type(col: Column) -> pa.DataType:
    """The Arrow type ``from_pandas`` gives the column's pandas dtype."""
    if isinstance(col, Labels):
        if col.categories_dtype == "str":
            values = pa.large_string()
        else:  # an object Index of categories: string, or null when it has none
            values = pa.string() if col.categories else pa.null()
        return pa.dictionary(pa.from_numpy_dtype(col.codes.dtype), values)
    if isinstance(col, OptionalInts):
        return pa.int64()
    if col.dtype == object:
        return pa.large_string()
    return pa.from_numpy_dtype(col.dtype)


def _arrow_array(col: Column, arrow_type: pa.DataType) -> pa.Array:
    """``col`` as an Arrow array of ``arrow_type``; numbers are not copied. Built from
    buffers, as ``pa.array`` would import pandas to ask whether its input is pandas'."""
    if isinstance(col, Labels):
        indices = _numbers(col.codes, col.codes < 0)
        return pa.DictionaryArray.from_arrays(indices, _texts(col.categories,
                                                              arrow_type.value_type))
    if isinstance(col, OptionalInts):
        missing = np.isnan(col.values)
        return _numbers(np.where(missing, 0, col.values).astype(np.int64), missing)
    if col.dtype == object:
        return _texts(col.tolist(), arrow_type)
    if col.dtype == bool:
        bits = np.packbits(col, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(col), [None, pa.py_buffer(bits)])
    return _numbers(col, np.isnan(col) if col.dtype.kind == "f" else None)  # NaN: null


def _numbers(values: np.ndarray, missing: np.ndarray | None) -> pa.Array:
    """A numeric array over ``values``' own memory, null where ``missing``."""
    values = np.ascontiguousarray(values)
    buffers = [_validity(missing), pa.py_buffer(values)]
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), buffers)


def _validity(missing: np.ndarray | None) -> pa.Buffer | None:
    """Arrow's validity bitmap (a set bit: a value) for rows ``missing`` marks, or None."""
    if missing is None or not missing.any():
        return None
    return pa.py_buffer(np.packbits(~missing, bitorder="little"))


def _texts(values: Sequence[str], arrow_type: pa.DataType) -> pa.Array:
    """Strings as an Arrow ``string``/``large_string`` array, or an empty ``null`` array (the
    dictionary of a label column with no categories). ASCII text (request ids) is encoded in
    one piece, its byte lengths being its lengths."""
    if arrow_type == pa.null():
        return pa.Array.from_buffers(pa.null(), 0, [None])
    joined = "".join(values)
    if joined.isascii():
        data, lengths = joined.encode("ascii"), map(len, values)
    else:
        encoded = [v.encode("utf-8") for v in values]
        data, lengths = b"".join(encoded), map(len, encoded)
    del joined
    offset_dtype = np.int64 if arrow_type == pa.large_string() else np.int32
    offsets = np.zeros(len(values) + 1, dtype=offset_dtype)
    np.cumsum(np.fromiter(lengths, offset_dtype, len(values)), out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(arrow_type, len(values), buffers)


def _pandas_column(name: str, col: Column, arrow_type: pa.DataType) -> dict[str, Any]:
    """One column's entry of the ``pandas`` metadata."""
    metadata: dict[str, Any] | None = None
    if isinstance(col, Labels):
        pandas_type, numpy_type = "categorical", str(col.codes.dtype)
        metadata = {"num_categories": len(col.categories), "ordered": False}
    elif isinstance(col, OptionalInts):
        pandas_type, numpy_type = "int64", "Int64"
    elif col.dtype == object:
        pandas_type, numpy_type = "object", "str"  # a large_string column of pandas' str
    else:
        pandas_type, numpy_type = _PANDAS_TYPES[arrow_type], str(col.dtype)
    return {"name": name, "field_name": name, "pandas_type": pandas_type,
            "numpy_type": numpy_type, "metadata": metadata}


def _pandas_version() -> str:
    """The installed pandas' version (which ``from_pandas`` records), read from its package
    metadata: importing pandas to ask would cost what writing without it saves."""
    from importlib.metadata import version

    return version("pandas")
