"""``twinserve simulate --explain-step``: one step's cost by term, and the vLLM dtype and
CUDA-graph flags, through the real command line."""

from __future__ import annotations

import pytest

from experiments import cli
from sim.cost.explain import ExplainStepError, parse_step


def test_spec_syntax() -> None:
    shape = parse_step("prefill:2x512@3584,decode:63x1024,prefill:100")
    assert shape.prefill_query_lens == (512, 512, 100)
    assert shape.prefill_context_lens == (3584, 3584, 0)
    assert (shape.num_decode_reqs, shape.decode_context_sum, shape.decode_context_max) == (
        63, 63 * 1024, 1024)
    assert shape.num_tokens == 63 + 1124 and shape.num_sampling_reqs == shape.num_reqs == 66


@pytest.mark.parametrize("spec,message", [
    ("decode:4", "decode needs NxC"),
    ("prefill:1", "at least 2 tokens"),
    ("mixed:4x4", "each part is"),
    ("decode:axb", "whole number"),
    ("decode:0x10", "names no tokens"),
])
def test_bad_specs_are_one_clear_error(spec: str, message: str) -> None:
    with pytest.raises(ExplainStepError, match=message):
        parse_step(spec)


def test_explain_step_prints_every_term_and_the_graph_plan(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: object) -> None:
    rc = cli.main(["simulate", "--model", "llama-3.1-70b", "--gpu", "h200-sxm", "-tp", "4",
                   "--explain-step", "decode:100x2000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "FULL CUDA graph at captured size 104 (+4 padded rows)" in out
    for name in ("gemm.qkv", "gemm.gate_up", "attention.decode", "allreduce", "lm_head",
                 "sampler", "device total"):
        assert name in out
    assert "161 × " in out  # 2 all-reduces per layer + 1


def test_dtype_and_graph_flags_reach_the_cost_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["simulate", "--gpu", "h100-sxm", "--quantization", "fp8", "--kv-cache-dtype",
                   "fp8", "--enforce-eager", "--explain-step", "decode:8x1000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "fp8 weights, fp8 KV" in out and "eager (no CUDA graph)" in out
    assert "fp8 GEMM" in out
    rc = cli.main(["simulate", "--cudagraph-capture-sizes", "1", "16", "--explain-step",
                   "decode:9x10"])
    assert rc == 0 and "captured size 16 (+7 padded rows)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--gpu", "a100-80gb", "--quantization", "fp8"], "needs fp8 tensor cores"),
    (["--dtype", "float32"], "dtype must be one of"),
    (["--kv-cache-dtype", "int4"], "kv_cache_dtype must be one of"),
    (["--max-cudagraph-capture-size", "100", "--cudagraph-capture-sizes", "8", "64"],
     "must equal the largest"),
    (["--explain-step", "decode:4"], "decode needs NxC"),
])
def test_bad_flags_end_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                   message: str) -> None:
    rc = cli.main(["simulate", *argv, "--explain-step", "decode:1x1"] if "--explain-step" not in
                  argv else ["simulate", *argv])
    err = capsys.readouterr().err
    assert rc != 0
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("twinserve: error:") and message in lines[0]
