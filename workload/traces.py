"""Trace files: request streams recorded from real services, as columns.

Three formats: a request-stream CSV ``arrived_at, num_prefill_tokens, num_decode_tokens``
(Vidur's format, seconds), an Azure LLM 2023 CSV ``TIMESTAMP, ContextTokens, GeneratedTokens``,
and a Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``: one id
per 512-token block, equal ids = shared prefix). A request-stream CSV or a Mooncake JSONL may
also give each request a ``tenant`` and an ``slo_class`` (optional columns / keys; non-empty
names, every row or none). Arrival times are seconds from the first request, sorted; every
problem is reported as a ``WorkloadError`` naming the file, the row or column, and what is
expected. ``TRACES`` names the traces shipped in ``workload/data/traces`` (sources and
licences in ``workload/data/SOURCES.md``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import is_int, is_number
from workload.errors import WorkloadError

DATA_DIR = Path(__file__).resolve().parent / "data"
TRACES = {
    "azure-conv": DATA_DIR / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv",
    "azure-code": DATA_DIR / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv",
    "mooncake-conversation": DATA_DIR / "traces" / "mooncake_fast25" / "conversation_trace.jsonl",
    "mooncake-synthetic": DATA_DIR / "traces" / "mooncake_fast25" / "synthetic_trace.jsonl",
}
MOONCAKE_BLOCK_TOKENS = 512
STREAM_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
#: Optional per-request labels of a request-stream CSV (columns) or a Mooncake JSONL (keys).
LABEL_COLUMNS = ("tenant", "slo_class")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


# -- traces --------------------------------------------------------------------------------------
@dataclass(slots=True)
class TraceRows:
    """Raw rows of a trace file (arrival seconds from the first request)."""

    arrival_s: np.ndarray
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    hash_ids: list[tuple[int, ...]] | None
    kind: str
    tenants: list[str] | None = None  # the tenant column (None: absent)
    slo_classes: list[str] | None = None  # the slo_class column (None: absent)


def resolve_trace_path(path: str) -> Path:
    if path in TRACES:
        return TRACES[path]
    p = Path(path)
    if p.is_dir():
        raise WorkloadError(f"trace {path!r} is a directory: give a trace file")
    if not p.is_file():
        raise WorkloadError(
            f"trace file {path!r} not found (give a path or one of {', '.join(TRACES)})"
        )
    return p


def _require_columns(path: Path, header: Sequence[str], needed: Sequence[str], kind: str) -> None:
    missing = [c for c in needed if c not in header]
    if missing:
        raise WorkloadError(
            f"{path}: {kind} trace is missing column(s) {', '.join(missing)}; "
            f"found {', '.join(header) or 'no header'}; expected {', '.join(needed)}"
        )


def _positive_ints(values: list[str] | list[int], path: Path, column: str) -> np.ndarray:
    try:
        floats = np.array([float(v) for v in values], dtype=np.float64)
    except ValueError as exc:
        raise WorkloadError(f"{path}: column {column} holds a non-number ({exc})") from None
    with np.errstate(invalid="ignore"):
        ok = np.abs(floats) < 2.0**62  # False for NaN and infinities too
        whole = ok & (floats == np.trunc(floats))
    if ok.all() and not whole.all():
        bad = int(np.argmin(whole))
        raise WorkloadError(
            f"{path}: column {column} holds a token count that is not a whole number "
            f"({values[bad]}, request {bad})"
        )
    if not ok.all():
        bad = int(np.argmin(ok))
        raise WorkloadError(
            f"{path}: column {column} holds a non-finite or too large number "
            f"({floats[bad]}, request {bad})"
        )
    return floats.astype(np.int64)


def load_trace(path_or_name: str) -> TraceRows:
    """Read a request-stream CSV, an Azure 2023 CSV or a Mooncake JSONL file."""
    path = resolve_trace_path(path_or_name)
    if path.suffix == ".jsonl":
        return _load_mooncake(path)
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            repeated = sorted({h for h in header if h and header.count(h) > 1})
            if repeated:
                raise WorkloadError(f"{path}: column(s) {', '.join(repeated)} appear twice")
            is_azure = "TIMESTAMP" in header or "ContextTokens" in header
            if is_azure:
                _require_columns(path, header, AZURE_COLUMNS, "Azure")
            else:
                _require_columns(path, header, STREAM_COLUMNS, "request-stream")
            rows = []
            for r in reader:
                if not r:
                    continue
                if len(r) != len(header):
                    raise WorkloadError(
                        f"{path}:{reader.line_num}: row has {len(r)} field(s), the header "
                        f"{len(header)} ({', '.join(header)})"
                    )
                rows.append(r)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise WorkloadError(f"cannot read trace {path}: {exc}") from None
    if not rows:
        raise WorkloadError(f"{path}: the trace holds no requests")
    cols = {name: [r[i] for r in rows] for i, name in enumerate(header) if name}
    if is_azure:
        try:
            stamps = [datetime.fromisoformat(t.strip()[:26]) for t in cols["TIMESTAMP"]]
        except ValueError as exc:
            raise WorkloadError(f"{path}: bad TIMESTAMP ({exc})") from None
        if len({t.tzinfo is None for t in stamps}) > 1:
            raise WorkloadError(
                f"{path}: TIMESTAMP mixes times with and without a UTC offset"
            )
        t0 = stamps[0]
        arrival = np.array([(t - t0).total_seconds() for t in stamps])
        prompt = _positive_ints(cols["ContextTokens"], path, "ContextTokens")
        output = _positive_ints(cols["GeneratedTokens"], path, "GeneratedTokens")
        kind = "azure"
    else:
        try:
            arrival = np.array([float(v) for v in cols["arrived_at"]])
        except ValueError as exc:
            raise WorkloadError(f"{path}: column arrived_at holds a non-number ({exc})") from None
        prompt = _positive_ints(cols["num_prefill_tokens"], path, "num_prefill_tokens")
        output = _positive_ints(cols["num_decode_tokens"], path, "num_decode_tokens")
        kind = "request-stream"
    tenants, classes = (
        _labels(path, cols.get(name), name) if not is_azure else None for name in LABEL_COLUMNS
    )
    return _checked(path, TraceRows(arrival, prompt, output, None, kind, tenants, classes))


def _labels(path: Path, values: list[str] | None, column: str) -> list[str] | None:
    """A label column's values, stripped; every one must be a non-empty name."""
    if values is None:
        return None
    out = [str(v).strip() for v in values]
    if not all(out):
        bad = out.index("")
        raise WorkloadError(
            f"{path}: column {column} is empty for request {bad}: give every request one "
            "(or leave the column out)"
        )
    return out


def _load_mooncake(path: Path) -> TraceRows:
    stamps, prompt, output, hashes = [], [], [], []
    labels: dict[str, list[str]] = {name: [] for name in LABEL_COLUMNS}
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    stamp = row["timestamp"]
                    if not is_number(stamp):
                        raise ValueError(f"timestamp must be a number, got {stamp!r}")
                    stamps.append(float(stamp) / 1000.0)
                    raw = (row["input_length"], row["output_length"])
                    if not all(_is_whole(v) for v in raw):
                        raise ValueError(f"lengths must be whole numbers, got {raw}")
                    ids = row.get("hash_ids", [])
                    if not isinstance(ids, list) or not all(is_int(h) for h in ids):
                        raise ValueError(f"hash_ids must be a list of integers, got {ids!r:.60}")
                    lengths = (int(raw[0]), int(raw[1]))
                    if max(abs(n) for n in lengths) >= 2**62:
                        raise ValueError(f"length out of range: {lengths}")
                    for name in LABEL_COLUMNS:
                        if name in row:
                            value = row[name]
                            if not isinstance(value, str) or not value.strip():
                                raise ValueError(
                                    f"{name} must be a non-empty string, got {value!r}"
                                )
                            labels[name].append(value.strip())
                    prompt.append(lengths[0])
                    output.append(lengths[1])
                    hashes.append(tuple(ids))
                except (
                    json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError
                ) as exc:
                    raise WorkloadError(
                        f"{path}:{lineno}: Mooncake rows need timestamp (ms), input_length, "
                        f"output_length and hash_ids ({type(exc).__name__}: {exc})"
                    ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read trace {path}: {exc}") from None
    if not stamps:
        raise WorkloadError(f"{path}: the trace holds no requests")
    for name, values in labels.items():
        if values and len(values) != len(stamps):
            raise WorkloadError(
                f"{path}: {len(values)} of {len(stamps)} rows give {name}: give it in every row "
                "or in none"
            )
    arrival = np.array(stamps) - stamps[0]
    rows = TraceRows(
        arrival, np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64), hashes,
        "mooncake", labels["tenant"] or None, labels["slo_class"] or None,
    )
    return _checked(path, rows)


def _is_whole(v: object) -> bool:
    """A JSON integer, or a float with no fractional part (never a bool or a string)."""
    return is_number(v) and (isinstance(v, int) or v.is_integer())


def _checked(path: Path, rows: TraceRows) -> TraceRows:
    finite = np.isfinite(rows.arrival_s)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise WorkloadError(
            f"{path}: request {bad} has an arrival time that is not a finite number "
            f"({rows.arrival_s[bad]})"
        )
    if (rows.prompt_lens < 1).any() or (rows.output_lens < 1).any():
        bad = int(np.argmax((rows.prompt_lens < 1) | (rows.output_lens < 1)))
        raise WorkloadError(
            f"{path}: request {bad} has a prompt or output of fewer than 1 token "
            f"({rows.prompt_lens[bad]}, {rows.output_lens[bad]})"
        )
    if (np.diff(rows.arrival_s) < 0).any():
        order = np.argsort(rows.arrival_s, kind="stable")

        def sort(values: list[Any] | None) -> list[Any] | None:
            return [values[i] for i in order] if values is not None else None

        rows = TraceRows(
            rows.arrival_s[order], rows.prompt_lens[order], rows.output_lens[order],
            sort(rows.hash_ids), rows.kind, sort(rows.tenants), sort(rows.slo_classes),
        )
    return rows
