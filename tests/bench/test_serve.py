"""The serving-path benchmark runs (its smoke mode: a zero-cost emulated server, 1 and 4
streams), so it never rots."""

from __future__ import annotations

import pytest

from bench.serve import main


def test_bench_serve_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke", "--json"]) == 0
    import json

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["concurrency"] for r in rows] == [1, 4, 4]
    assert all(r["errors"] == 0 and r["requests_per_s"] > 0 for r in rows)
    assert all(r["ttft_p50_ms"] > 0 for r in rows)
