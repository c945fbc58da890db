"""Compile every Triton kernel for an H100/H200 (sm_90) ahead of time, with no GPU present.

Responsibility: catch what the interpreter cannot — type errors of the compiled front end, dot
shapes the hardware rejects, register spills — on a machine without a GPU, using the ``ptxas``
bundled with Triton. The compile-time arguments come from the launchers' own ``*_meta`` helpers, so
what is compiled here is what a launch would compile. Integer arguments named ``stride*`` are
marked divisible by 16 (as Triton's runtime specialisation does for real strides), which enables
vectorised, pipelined loads.

Run: ``python -m kernels.compile_check [--quick]``, without ``TRITON_INTERPRET=1``. Prints one line
per variant — registers, spilled bytes, shared memory — and exits non-zero on any failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.backend import is_triton_interpreter_enabled
from kernels.selection import decode_tile_config, unified_tile_config
from kernels.validation import AttentionDims, CacheDims

#: Compute capability of the target GPU (Hopper: H100/H200).
TARGET_ARCH = 90


@dataclass(frozen=True, slots=True)
class CompileResult:
    """Resource use of one compiled kernel variant."""

    name: str  # kernel and variant label
    registers: int  # registers per thread (-1 when cuobjdump is unavailable)
    spill_bytes: int  # local-memory bytes per thread; > 0 means register spills
    shared_bytes: int  # dynamic shared memory per program


@dataclass(frozen=True, slots=True)
class Variant:
    """One kernel specialisation to compile."""

    name: str  # label printed in the report
    kernel: object  # the JITFunction
    pointer_types: dict[str, str]  # pointer argument -> Triton type string, e.g. "*bf16"
    constexprs: dict[str, object]  # compile-time arguments
    num_warps: int  # warps per program
    num_stages: int  # pipelining depth


_TYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _dims(num_q: int, num_kv: int, head_dim: int, block_size: int, max_q: int) -> AttentionDims:
    return AttentionDims(
        num_tokens=4096, num_seqs=64, num_q_heads=num_q, num_kv_heads=num_kv, head_dim=head_dim,
        num_blocks=4096, block_size=block_size, max_blocks_per_seq=512, max_query_len=max_q,
        max_seq_len=8192,
    )


def _attention_pointers(dtype: torch.dtype) -> dict[str, str]:
    data = "*" + _TYPE[dtype]
    return {
        "out_ptr": data, "query_ptr": data, "k_cache_ptr": data, "v_cache_ptr": data,
        "block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
        "partial_out_ptr": "*fp32", "partial_lse_ptr": "*fp32",
    }


def build_variants(quick: bool = False) -> list[Variant]:
    """The variants worth compiling: Llama-3.1-8B shapes per dtype, plus awkward shapes.

    ``quick`` keeps bf16 Llama shapes and one awkward shape (non-power-of-two GQA group and head
    dim, block size 1): the variants a test can afford.
    """
    import triton.language as tl

    from kernels.triton_cache import _reshape_and_cache_kernel, cache_meta
    from kernels.triton_decode import (
        _decode_attention_kernel,
        _merge_splits_kernel,
        decode_meta,
        merge_meta,
    )
    from kernels.triton_unified import _unified_attention_kernel, unified_meta

    tl_type = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
    shapes = [  # (label, num_q, num_kv, head_dim, block_size, dtypes)
        ("llama8b", 32, 8, 128, 16, (torch.bfloat16, torch.float16, torch.float32)),
        ("gqa3-d80-bs1", 12, 4, 80, 1, (torch.bfloat16,)),
        ("mqa32-d256-bs32", 32, 1, 256, 32, (torch.bfloat16,)),
    ]
    if quick:
        shapes = [(label, q, kv, d, bs, dtypes[:1]) for label, q, kv, d, bs, dtypes in shapes[:2]]
    variants: list[Variant] = []
    for label, num_q, num_kv, head_dim, block_size, dtypes in shapes:
        for dtype in dtypes:
            ptrs = _attention_pointers(dtype)
            dot = tl_type[dtype]
            tag = f"{label}-{_TYPE[dtype]}"
            for max_q, mean_q in ((1, 1), (512, 16), (512, 512)):
                dims = _dims(num_q, num_kv, head_dim, block_size, max_q)
                cfg = unified_tile_config(
                    num_queries_per_kv=dims.num_queries_per_kv, max_query_len=max_q,
                    mean_query_len=mean_q, head_dim=head_dim,
                )
                variants.append(Variant(
                    f"unified-{tag}-m{cfg.block_m}", _unified_attention_kernel, ptrs,
                    unified_meta(dims, cfg, dot), cfg.num_warps, cfg.num_stages,
                ))
            dims = _dims(num_q, num_kv, head_dim, block_size, 1)
            cfg = decode_tile_config(num_queries_per_kv=dims.num_queries_per_kv, head_dim=head_dim)
            for partial in (False, True):
                variants.append(Variant(
                    f"decode-{tag}-{'split' if partial else 'nosplit'}", _decode_attention_kernel,
                    ptrs, decode_meta(dims, cfg, partial, dot), cfg.num_warps, cfg.num_stages,
                ))
            variants.append(Variant(
                f"merge-{tag}", _merge_splits_kernel, ptrs, merge_meta(dims, 8), 4, 1
            ))
            cache_dims = CacheDims(4096, num_kv, head_dim, 4096, block_size)
            cache_ptrs = {"key_ptr": ptrs["out_ptr"], "value_ptr": ptrs["out_ptr"],
                          "k_cache_ptr": ptrs["out_ptr"], "v_cache_ptr": ptrs["out_ptr"],
                          "slot_mapping_ptr": "*i64"}
            variants.append(Variant(
                f"cache-{tag}", _reshape_and_cache_kernel, cache_ptrs, cache_meta(cache_dims),
                4, 1,
            ))
    return variants


def compile_variant(variant: Variant, workdir: Path) -> CompileResult:
    """Compile one variant for sm_90 and read its resource use."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = variant.kernel
    arg_names: list[str] = fn.arg_names  # type: ignore[attr-defined]
    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    for index, name in enumerate(arg_names):
        if name in variant.constexprs:
            signature[name] = "constexpr"
        elif name in variant.pointer_types:
            signature[name] = variant.pointer_types[name]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale_log2":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name.startswith("stride"):
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, variant.constexprs, attrs)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", TARGET_ARCH, 32),
        options={"num_warps": variant.num_warps, "num_stages": variant.num_stages},
    )
    registers, spills = _resource_usage(compiled.asm["cubin"], workdir / f"{variant.name}.cubin")
    return CompileResult(variant.name, registers, spills, int(compiled.metadata.shared))


def _resource_usage(cubin: bytes, path: Path) -> tuple[int, int]:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return -1, 0
    path.write_bytes(cubin)
    text = subprocess.run(
        [str(tool), "-res-usage", str(path)], capture_output=True, text=True, check=True
    ).stdout
    regs = re.search(r"REG:(\d+)", text)
    local = re.search(r"LOCAL:(\d+)", text)
    return (int(regs.group(1)) if regs else -1), (int(local.group(1)) if local else 0)


def run_all(report: Callable[[str], None] = print, quick: bool = False) -> list[CompileResult]:
    """Compile every variant (``quick``: a subset); raises on the first failure."""
    if is_triton_interpreter_enabled():
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset (it compiles for a GPU)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in build_variants(quick):
            result = compile_variant(variant, Path(tmp))
            report(f"{result.name:40s} regs={result.registers:4d} "
                   f"spill_bytes={result.spill_bytes:5d} shared_bytes={result.shared_bytes:6d}")
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: compile the variants, print their resources."""
    args = sys.argv[1:] if argv is None else argv
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        run_all(quick="--quick" in args)
    except Exception as exc:  # report any compiler failure as a non-zero exit
        print(f"compile_check FAILED: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
