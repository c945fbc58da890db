"""Vidur as the peer of ``python -m bench.simulator vidur-stream --peer``.

Vidur (github.com/microsoft/vidur) simulates a deployment from operator profiles it ships. The
attention profile of the vidur-stream case's deployment (Llama-2-70B on A100,
``data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/attention.csv`` in Vidur's tree) is a
Git LFS object that a plain clone lacks, and Vidur stops without it. ``attention`` writes a
stand-in in Vidur's format from twinserve's own cost model of that deployment: per layer and
GPU at TP 2, milliseconds, decode rows from the attention model at the batch's context, prefill
rows for one chunk after a cached prefix, and the KV-cache save as the model's KV-cache write
(the terms ``twinserve simulate --explain-step`` prints). Vidur's attention then costs what
ours does; its other operators keep its own profiles. The stand-in changes Vidur's step times,
not the work its simulation does per step, which is what the side-by-side CPU figure compares.
Vidur trains its predictors on its first run and caches them under keys that leave out the
attention file's path: give each stand-in a cache directory of its own (``--cache-dir``), or a
cache trained on another attention file is used silently.

``command`` prints the shell command that runs Vidur (its checkout at ``--vidur-dir``, the
directory holding ``vidur/`` and ``data/``, run from there: its profile paths are relative)
on the case's stream (``VIDUR_STREAM``, already in Vidur's trace-replay format) with the
case's deployment and scheduler: TP 2, one replica, Sarathi chunks of 512 tokens (the token
budget), at most 128 sequences; plots and the Chrome trace off, its metrics CSVs on.

Usage::

    python -m bench.vidur_peer attention OUT.csv
    python -m bench.simulator vidur-stream --repeat 4 --peer \\
        "$(python -m bench.vidur_peer command --vidur-dir DIR --attention OUT.csv)"
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.simulator import CASES, VIDUR_STREAM
from engine.core.outputs import BatchShape

CASE = CASES["vidur-stream"]


def _flag(name: str) -> str:
    """The value the case gives flag ``name``."""
    return CASE[CASE.index(name) + 1]


MODEL = _flag("--model")
GPU = _flag("--gpu")
TENSOR_PARALLEL = int(_flag("--tensor-parallel-size"))
BLOCK_SIZE = 16  # Vidur's default, part of the profile's key
MAX_MODEL_LEN = 4096  # Llama-2's, and Vidur's longest profiled context
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
CONTEXTS = (0, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584, 4095)
CHUNKS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 448, 512, 768, 1024, 2048, 4096)

COLUMNS = (
    "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
    "max_model_len", "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
    "time_stats.attn_prefill.median", "time_stats.attn_decode.median",
    "time_stats.attn_kv_cache_save.median",
)


@dataclass(frozen=True)
class AttentionRow:
    """One row of Vidur's attention profile: per-layer, per-GPU milliseconds (None: not
    measured by this row; Vidur reads decode rows for decode, the others for prefill)."""

    batch_size: int
    prefill_chunk_size: int  # 0: a decode row
    kv_cache_size: int
    prefill_ms: float | None
    decode_ms: float | None
    kv_cache_save_ms: float


def _decode_shape(batch: int, context: int) -> BatchShape:
    """``batch`` decodes, each after ``context`` cached tokens."""
    return BatchShape(batch, batch, (), (), batch, batch * context, context, batch)


def _chunk_shape(chunk: int, cached: int) -> BatchShape:
    """One prefill chunk of ``chunk`` tokens after ``cached`` ones."""
    return BatchShape(1, chunk, (chunk,), (cached,), 0, 0, 0, 1)


def attention_rows() -> list[AttentionRow]:
    """The stand-in profile: the attention and KV-cache-write terms of the vidur-stream case's
    step model (bf16, TP 2, A100; ``explain``), per layer."""
    from sim.config import SimConfig, resolve_engine_config
    from sim.cost.vllm_step import VllmStepCostModel
    from sim.runtime import make_cost_model

    cfg = SimConfig(model=MODEL, gpu=GPU, tensor_parallel_size=TENSOR_PARALLEL)
    model = make_cost_model(cfg, resolve_engine_config(cfg))
    if not isinstance(model, VllmStepCostModel):
        raise SystemExit(f"the stand-in needs the vLLM step model, not {type(model).__name__}")
    layers = cfg.model_spec.num_layers

    def per_layer_ms(shape: BatchShape) -> tuple[float, float]:
        """(attention, KV-cache write) of the step, ms per layer."""
        terms = {t.name: t.seconds for t in model.explain(shape).terms}
        attention = terms["attention.prefill"] if shape.prefill_query_lens else (
            terms["attention.decode"])
        return attention / layers * 1e3, terms["kv_cache_write"] / layers * 1e3

    rows: list[AttentionRow] = []
    for batch in DECODE_BATCHES:
        for context in CONTEXTS[1:]:
            attention, save = per_layer_ms(_decode_shape(batch, context))
            rows.append(AttentionRow(batch, 0, context, None, attention, save))
    for chunk in CHUNKS:
        for context in CONTEXTS:
            if chunk + context <= MAX_MODEL_LEN:
                attention, save = per_layer_ms(_chunk_shape(chunk, context))
                rows.append(AttentionRow(1, chunk, context, attention, None, save))
    return rows


def write_attention(path: Path) -> int:
    """Write the stand-in profile as Vidur's CSV; returns its number of rows."""
    from sim.model_catalog import get_model

    spec = get_model(MODEL)
    fixed = (spec.hidden_size, spec.num_heads, spec.num_kv_heads, BLOCK_SIZE, TENSOR_PARALLEL,
             MAX_MODEL_LEN)
    rows = attention_rows()
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for r in rows:
            out.writerow((*fixed, r.batch_size, r.prefill_chunk_size, r.kv_cache_size,
                          r.prefill_chunk_size > 0,
                          "" if r.prefill_ms is None else repr(r.prefill_ms),
                          "" if r.decode_ms is None else repr(r.decode_ms),
                          repr(r.kv_cache_save_ms)))
    return len(rows)


def vidur_command(vidur_dir: Path, attention: Path, python: str, cache_dir: str,
                  out_dir: str) -> str:
    """The shell command running Vidur on the vidur-stream case (see the module)."""
    args = [
        python, "-m", "vidur.main",
        "--replica_config_model_name", MODEL,
        "--replica_config_device", "a100",
        "--replica_config_tensor_parallel_size", str(TENSOR_PARALLEL),
        "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", "1",
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_chunk_size", _flag("--max-num-batched-tokens"),
        "--sarathi_scheduler_config_batch_size_cap", _flag("--max-num-seqs"),
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(VIDUR_STREAM),
        "--random_forrest_execution_time_predictor_config_attention_input_file",
        str(attention.resolve()),
        "--metrics_config_cache_dir", cache_dir,
        "--metrics_config_output_dir", out_dir,
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
    ]
    return f"cd {shlex.quote(str(vidur_dir))} && {shlex.join(args)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("attention", help="write the stand-in attention profile (Vidur's CSV)")
    a.add_argument("out", type=Path)
    c = sub.add_parser("command", help="print the Vidur command for --peer")
    c.add_argument("--vidur-dir", type=Path, required=True,
                   help="Vidur's checkout (its data/profiling must be there)")
    c.add_argument("--attention", type=Path, required=True, help="the stand-in's path")
    c.add_argument("--python", default="python", help="the Python that has Vidur installed")
    c.add_argument("--cache-dir", default="cache",
                   help="Vidur's predictor cache (trained on its first run, reused after)")
    c.add_argument("--out-dir", default="/tmp/vidur_out", help="Vidur's metrics directory")
    args = parser.parse_args(argv)
    if args.what == "attention":
        print(f"{write_attention(args.out)} rows -> {args.out}")
        return 0
    if not (args.vidur_dir / "vidur").is_dir():
        parser.error(f"{args.vidur_dir} is not a Vidur checkout (no vidur/ package in it)")
    if not args.attention.is_file():
        parser.error(f"no stand-in profile at {args.attention}: write it with `attention`")
    print(vidur_command(args.vidur_dir, args.attention, args.python, args.cache_dir,
                        args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
