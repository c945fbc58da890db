"""The GPU benchmark's CPU smoke mode and the sm_90 ahead-of-time compile both keep working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )


def test_gpu_benchmark_smoke_mode_prints_its_table(tmp_path: Path) -> None:
    """Runs the script as the H200 would (a module of the checkout, not an installed package)
    on the CPU."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out_json = tmp_path / "bench.json"
    result = _run(
        ["-m", "bench.gpu_attention", "--smoke", "--out", str(out_json)], env, 300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert "correctness: PASS" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("case "))
    table = lines[header + 1 :]
    assert any(line.startswith("decode B=2 ctx=40") for line in table)
    assert any(line.startswith("chunk 12@20 + 2 dec@30") and "unified/1" in line
               for line in table)
    assert "rows" in out_json.read_text()


def test_kernels_compile_for_sm90_without_a_gpu() -> None:
    """Front end + ptxas for Hopper: catches compile-only errors the interpreter cannot see."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this triton wheel bundles no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = _run(["-m", "kernels.compile_check", "--quick"], env, 300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "spill_bytes=    0" in result.stdout
    for line in result.stdout.splitlines():
        assert "spill_bytes=    0" in line, f"register spills: {line}"
