"""``python -m bench.gpu_real_smoke --smoke`` runs end to end on CPU (Triton interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_real_smoke import main

#: The Triton interpreter (3.6) trips a numpy deprecation warning on every launch.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:triton")


def test_smoke_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    argv = ["--smoke", "--batch-sizes", "1,2", "--context-len", "8", "--decode-steps", "2",
            "--prefill-lens", "8", "--repeats", "1", "--json-out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "attention check [" in printed and "PASS" in printed
    result = json.loads(out.read_text())
    assert result["attention_check"]["ok"]
    assert result["attention_check"]["mixed_calls"] > 0
    kinds = [(r["kind"], r.get("batch", r.get("tokens"))) for r in result["rows"]]
    assert kinds == [("decode", 1), ("decode", 2), ("prefill", 8)]
    assert all(r["median_ms"] > 0 for r in result["rows"])
