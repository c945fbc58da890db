"""GPU smoke run of the real worker: a Llama-3.1-8B-shaped model in bf16 with random weights.

Usage (repository root)::

    python -m bench.gpu_real_smoke                 # CUDA: 8B shape, bf16, Triton
    python -m bench.gpu_real_smoke --smoke         # CPU: tiny model, Triton interpreter
    python -m bench.gpu_real_smoke --json-out rows.json

What it does, in order (about 2–3 minutes on an H200, well under 5):

1. **Attention check inside the model**: a small engine (token budget 128 — 16 with ``--smoke``
   — so long prompts are
   chunked next to running decodes) runs greedy generation with the Triton backend while every
   layer's attention is recomputed with the torch reference on the same paged cache; it reports
   the worst error relative to the kernels' tolerance for the dtype, and checks that
   ``reshape_and_cache`` wrote every new K/V row to its slot exactly. Fails (exit 1) if any
   layer of any step is out of tolerance.
2. **Decode step times by batch size**: B prompts of ``--context-len`` random tokens are
   prefilled, then ``--decode-steps`` decode steps run; the median decode step is reported with
   tokens/s and the weight + KV bytes it streams (GB/s).
3. **Prefill step times** for single prompts of each ``--prefill-lens`` length, with TFLOP/s.

Step times are the executor's measured ``execute_model`` wall times (CUDA synchronised): input
preparation, forward, sampling. Needs only torch (+ triton on CUDA): dummy weights, token-id
prompts, no tokenizer, no safetensors, no network.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000,
    "eos_token_id": 128001,
}
TINY: dict[str, Any] = {
    **LLAMA_31_8B, "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 4096, "torch_dtype": "float32",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU (CI check)")
    p.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    p.add_argument("--dtype", default=None, help="default: bfloat16 (float32 with --smoke)")
    p.add_argument("--batch-sizes", default=None, help="decode batch sizes, e.g. 1,8,32,128,256")
    p.add_argument("--context-len", type=int, default=None, help="prompt length of decodes")
    p.add_argument("--decode-steps", type=int, default=None)
    p.add_argument("--prefill-lens", default=None, help="e.g. 512,2048,8192")
    p.add_argument("--repeats", type=int, default=3, help="prefill repetitions (median)")
    p.add_argument("--json-out", default=None, help="write all measured rows to this file")
    args = p.parse_args(argv)
    big = not args.smoke
    args.device = args.device or ("cuda" if big else "cpu")
    args.dtype = args.dtype or ("bfloat16" if big else "float32")
    args.batch_sizes = [int(x) for x in (args.batch_sizes or ("1,8,32,128,256" if big else "1,4"))
                        .split(",")]
    args.context_len = args.context_len or (1024 if big else 24)
    args.decode_steps = args.decode_steps or (32 if big else 4)
    lens = args.prefill_lens or ("512,2048,8192" if big else "16,64")
    args.prefill_lens = [int(x) for x in lens.split(",")]
    return args


def write_config(root: Path, smoke: bool) -> str:
    (root / "config.json").write_text(json.dumps(TINY if smoke else LLAMA_31_8B))
    return str(root)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(n)]


def checking_attention(base: Any, record: dict[str, float]) -> Any:
    """A PagedAttention that also runs the reference and records the worst tolerance ratio."""
    import kernels
    from engine.worker.attention import PagedAttention

    class Checking(PagedAttention):
        def __call__(self, query, key, value, k_cache, v_cache, meta):  # type: ignore[override]
            out = super().__call__(query, key, value, k_cache, v_cache, meta)
            tol = kernels.attention_tolerance(query.dtype)
            slots = meta.slot_mapping
            written = k_cache.view(-1, *k_cache.shape[2:])[slots]
            record["cache_mismatches"] += int((written != key).any(dim=(1, 2)).sum())
            ref = kernels.paged_attention(
                query, k_cache, v_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
                scale=self.scale, max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
                backend="reference",
            )
            err = (out.float() - ref.float()).abs()
            allowed = tol.atol + tol.rtol * ref.float().abs()
            record["worst_ratio"] = max(record["worst_ratio"], float((err / allowed).max()))
            record["max_abs_err"] = max(record["max_abs_err"], float(err.max()))
            record["calls"] += 1
            record["mixed_calls"] += int(meta.max_query_len > 1 and meta.num_seqs > 1)
            return out

    return Checking(base.backend, base.scale)


def attention_check(model_dir: str, args: argparse.Namespace, backend: str) -> dict[str, Any]:
    from engine.core.request import SamplingParams
    from engine.llm import LLM

    llm = LLM(model_dir, load_format="dummy", dtype=args.dtype, device=args.device,
              attention_backend=backend, max_num_batched_tokens=16 if args.smoke else 128,
              max_num_seqs=8,
              num_gpu_blocks=256, max_model_len=1024, enable_prefix_caching=False)
    record = {"worst_ratio": 0.0, "max_abs_err": 0.0, "calls": 0, "mixed_calls": 0,
              "cache_mismatches": 0}
    model = llm.executor.model
    model.set_attention(checking_attention(model.attention, record))
    vocab = llm.engine.model_config.vocab_size
    lengths = [300, 45, 7, 130] if not args.smoke else [20, 9, 3, 13]
    prompts = [p for n in lengths for p in random_prompts(1, n, vocab, seed=n)]
    start = time.perf_counter()
    max_tokens = 3 if args.smoke else 6
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    record["seconds"] = time.perf_counter() - start
    record["backend"] = backend
    record["ok"] = record["worst_ratio"] <= 1.0 and record["cache_mismatches"] == 0
    llm.shutdown()
    return record


def median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values) if values else float("nan")


def decode_rows(llm: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from engine.core.request import SamplingParams

    mc = llm.engine.model_config
    weight_bytes = mc.num_params() * int(llm.executor.dtype.itemsize)
    kv_per_token = llm.executor.kv_spec.bytes_per_block // llm.executor.kv_spec.block_size
    rows = []
    for b in args.batch_sizes:
        prompts = random_prompts(b, args.context_len, mc.vocab_size, seed=1000 + b)
        first = len(llm.executor.step_timings)
        # Prompts are prefilled over several steps (next to the decodes of earlier ones): make
        # every request outlive the last prefill by decode_steps, so that many steps decode
        # exactly the whole batch.
        budget = llm.engine.engine_config.scheduler.token_budget
        prefill_steps = -(-b * args.context_len // (budget - b)) + 1
        params = SamplingParams(max_tokens=args.decode_steps + prefill_steps + 2,
                                temperature=0.0, ignore_eos=True)
        llm.generate(prompts, params)
        steps = [t for t in llm.executor.step_timings[first:]
                 if t.batch_shape.num_decode_reqs == b and t.batch_shape.num_tokens == b]
        ms = median_ms([t.execute_time_s for t in steps])
        ctx = args.context_len + args.decode_steps // 2
        bytes_step = weight_bytes + b * ctx * kv_per_token
        rows.append({"kind": "decode", "batch": b, "context_len": args.context_len,
                     "steps": len(steps), "median_ms": ms, "tokens_per_s": b / ms * 1e3,
                     "gb_per_s": bytes_step / ms / 1e6})
        print(f"decode  batch={b:4d} ctx={args.context_len:5d} steps={len(steps):3d} "
              f"median={ms:8.2f} ms  {b / ms * 1e3:10.1f} tok/s  "
              f"~{bytes_step / ms / 1e6:7.1f} GB/s", flush=True)
    return rows


def prefill_rows(llm: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from engine.core.request import SamplingParams

    mc = llm.engine.model_config
    rows = []
    for length in args.prefill_lens:
        times = []
        for r in range(args.repeats):
            first = len(llm.executor.step_timings)
            prompt = random_prompts(1, length, mc.vocab_size, seed=50_000 + 97 * r + length)
            llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            times += [t.execute_time_s for t in llm.executor.step_timings[first:]
                      if t.batch_shape.num_tokens == length]
        ms = median_ms(times)
        linear_flops = 2 * mc.num_params() * length
        attn_flops = 2 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim * length**2
        tflops = (linear_flops + attn_flops) / (ms / 1e3) / 1e12
        rows.append({"kind": "prefill", "tokens": length, "runs": len(times), "median_ms": ms,
                     "tokens_per_s": length / ms * 1e3, "tflops": tflops})
        print(f"prefill tokens={length:6d} runs={len(times)} median={ms:8.2f} ms  "
              f"{length / ms * 1e3:10.1f} tok/s  ~{tflops:6.1f} TFLOP/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from engine.llm import LLM
    from kernels import is_triton_interpreter_enabled

    t0 = time.perf_counter()
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}  device {device_name}  dtype {args.dtype}", flush=True)
    use_triton = args.device.startswith("cuda") or is_triton_interpreter_enabled()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_config(Path(tmp), args.smoke)
        check = attention_check(model_dir, args, "triton" if use_triton else "reference")
        print(f"attention check [{check['backend']}]: {'PASS' if check['ok'] else 'FAIL'}  "
              f"worst error/tolerance={check['worst_ratio']:.3f}  max|err|="
              f"{check['max_abs_err']:.2e}  layer calls={check['calls']} "
              f"(mixed prefill+decode: {check['mixed_calls']})  "
              f"cache mismatches={check['cache_mismatches']}  ({check['seconds']:.1f} s)",
              flush=True)
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        budget = max(*args.prefill_lens, 2 * max(args.batch_sizes))
        llm = LLM(model_dir, load_format="dummy", dtype=args.dtype, device=args.device,
                  max_num_batched_tokens=budget, max_num_seqs=max(args.batch_sizes),
                  max_model_len=max(budget, args.context_len + args.decode_steps + 8),
                  enable_prefix_caching=False,
                  kv_cache_memory=(1 << 26) if args.device == "cpu" else None)
        ex = llm.executor
        print(f"engine: {ex.num_gpu_blocks} KV blocks ({ex.kv_cache_bytes / 2**30:.2f} GiB), "
              f"backend {ex.attention_backend}, budget {budget} tokens", flush=True)
        rows = decode_rows(llm, args) + prefill_rows(llm, args)
    result = {"device": device_name, "dtype": args.dtype, "attention_check": check, "rows": rows,
              "seconds": time.perf_counter() - t0}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"done in {result['seconds']:.1f} s: {'OK' if check['ok'] else 'ATTENTION CHECK FAILED'}")
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
