"""The command-line flags several ``twinserve`` commands share, in one public module.

* ``add_sim_flags`` / ``add_workload_flags`` — vLLM's engine flags and ``vllm bench serve``'s
  workload flags for a simulation (``simulate``, ``plan``); the workload group alone for the
  real engine (``run-real``, ``validate``). Each flag's destination is a key of
  ``experiments.simconfig.FLAG_FIELDS``, which maps it to its config field.
* ``add_engine_flags`` / ``engine_args_from_flags`` — the real engine's flags and the
  ``engine.llm.EngineArgs`` they give (``generate``, ``run-real``, ``profile``, ``validate``;
  ``generate`` and ``run-real`` also take the TP/PP layout). They carry vLLM's names, as
  ``simulate`` and ``serve`` do (``--num-gpu-blocks-override``,
  ``--enable-prefix-caching/--no-enable-prefix-caching`` …); the older spellings
  (``--num-gpu-blocks``, ``--no-prefix-caching``, ``--no-chunked-prefill``) still work.
* ``add_report_flags`` / ``default_out_dir`` — where a run is written and what its summary
  reports (``simulate``, ``run-real``).
* the value types every command's flags use (``positive_int``, ``seed``, ``finite_float`` …):
  one rule per kind of value, checked when the command line is parsed, so every command refuses
  what ``simulate`` refuses — NaN, infinities, negative seeds, zero sizes — before any work,
  in one line.

Every flag defaults to None (not given) unless stated, so a flag overrides a config file only
when the user gives it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.llm import EngineArgs


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    """Engine, model/hardware and workload flags (all default to None = not given)."""
    bool_flag = argparse.BooleanOptionalAction
    g = p.add_argument_group("model and hardware")
    g.add_argument("--model", help="catalog model (Hugging Face id or alias, e.g. "
                   "meta-llama/Llama-3.1-8B, qwen3-30b-a3b; --list-models) or a path to a "
                   "config.json or a model directory")
    g.add_argument("--gpu", help="catalog GPU, e.g. h100-sxm, h200-sxm, b200, mi300x "
                   "(--list-gpus)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int)
    g.add_argument("--data-parallel-size", "-dp", type=int, help="engine replicas")
    g.add_argument("--enable-expert-parallel", action=argparse.BooleanOptionalAction,
                   default=None, help="MoE models: spread the experts over the TP × DP ranks "
                   "(vLLM's flag)")
    g.add_argument("--all2all-backend", choices=["allgather_reducescatter", "alltoall"],
                   help="expert-parallel dispatch/combine (default allgather_reducescatter, "
                   "vLLM's; alltoall: DeepEP/pplx-style)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int,
                   help="pipeline stages per replica (one batch in flight per stage)")
    g.add_argument("--gpus-per-node", type=int,
                   help="GPUs per node (8): pipeline hops beyond a node cross the network")
    g.add_argument("--network", help="fabric between nodes: infiniband-ndr (default), "
                   "infiniband-hdr, roce-400, ethernet-100")
    g.add_argument("--router", help="replica router: vllm (default), round_robin, random, "
                   "consistent_hash, least_outstanding, least_kv, prefix_aware")
    g.add_argument("--router-load-cap", type=int,
                   help="prefix_aware: extra in-flight requests tolerated for a better hit")
    g.add_argument("--gpu-memory-utilization", type=float)
    g.add_argument("--num-gpu-blocks-override", type=int, help="KV blocks incl. the null block")
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--cost-model", help="auto (default: vllm where the GPU has measured kernel "
                   "tables, else roofline), vllm, roofline or fitted:PATH")
    g.add_argument("--dtype", help="model dtype: auto (default), bfloat16, float16")
    g.add_argument("--quantization", help="fp8: fp8 weights, W8A8 GEMMs (GPUs with fp8 only)")
    g.add_argument("--kv-cache-dtype", help="auto (default: the model dtype) or fp8 "
                   "(fp8_e4m3, fp8_e5m2): half the KV bytes")
    g = p.add_argument_group("engine (vLLM's names and defaults)")
    g.add_argument("--max-num-batched-tokens", type=int, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int)
    g.add_argument("--enable-chunked-prefill", action=bool_flag, default=None)
    g.add_argument("--long-prefill-token-threshold", type=int)
    add_policy_flags(g)
    g.add_argument("--scheduler-reserve-full-isl", action=bool_flag, default=None)
    g.add_argument("--async-scheduling", action=bool_flag, default=None)
    g.add_argument("--block-size", type=int)
    g.add_argument("--enable-prefix-caching", action=bool_flag, default=None)
    g.add_argument("--enforce-eager", action=bool_flag, default=None,
                   help="no CUDA graphs: every kernel launched from the host")
    g.add_argument("--max-cudagraph-capture-size", type=int,
                   help="largest captured batch (default: vLLM's, 512; 1024 on Blackwell)")
    g.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", metavar="N",
                   help="the token counts to capture CUDA graphs at (default: vLLM's list)")
    g.add_argument("--api-server-count", type=int, help="front-end processes")
    g.add_argument("--fast-path", action=bool_flag, default=None,
                   help="bulk-apply identical decode steps (exact; default on)")
    add_workload_flags(p)


#: ``--scheduling-policy``'s help (every command that runs an engine has the flag).
POLICY_HELP = (
    "fcfs (default), priority, sjf, srpt, edf, vtc, decode-first, prefill-first, shed, or "
    "package.module:ClassName (a policy class of your own; engine/core/policy.py)"
)


def add_policy_flags(g: argparse._ArgumentGroup) -> None:
    """``--scheduling-policy NAME`` and ``--policy-option KEY=VALUE ...`` (default None)."""
    g.add_argument("--scheduling-policy", metavar="NAME", help=POLICY_HELP)
    g.add_argument("--policy-option", nargs="+", action="extend", type=policy_option,
                   metavar="KEY=VALUE",
                   help="an option of the scheduling policy, e.g. predictor=bucket chunk=256 "
                   "(numbers and true/false are typed; engine/policies/)")


def policy_option(text: str) -> tuple[str, str | int | float | bool]:
    """``KEY=VALUE`` → (key, value): integers, numbers and true/false typed, else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    raw = raw.strip()
    value: str | int | float | bool = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
    return key.strip(), value


def policy_options_from_flags(
    given: list[tuple[str, str | int | float | bool]] | None,
) -> dict[str, str | int | float | bool] | None:
    """``--policy-option`` values as a dict (None: not given); a key given twice is an error."""
    if given is None:
        return None
    keys = [k for k, _ in given]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        from engine.core.errors import UserError

        raise UserError(f"--policy-option gives {', '.join(twice)} more than once")
    return dict(given)


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    """vllm bench serve's workload flags (default None = not given)."""
    g = p.add_argument_group("workload (vllm bench serve's names)")
    g.add_argument(
        "--dataset-name", choices=["random", "prefix_repetition", "trace", "sharegpt"],
        help="default: trace azure-conv, unless --dataset-path (trace; a .json file: "
        "sharegpt), --random-* (random) or --prefix-repetition-* (prefix_repetition) flags "
        "imply another",
    )
    g.add_argument("--dataset-path", help="trace file, or azure-conv, azure-code, "
                   "mooncake-conversation, mooncake-synthetic; or a ShareGPT JSON file")
    g.add_argument("--num-prompts", type=int)
    g.add_argument("--request-rate", type=float, help="requests/s (inf = all at once)")
    g.add_argument("--burstiness", type=float)
    g.add_argument("--max-concurrency", type=int)
    g.add_argument("--random-input-len", type=int)
    g.add_argument("--random-output-len", type=int)
    g.add_argument("--random-range-ratio", type=float)
    g.add_argument("--random-prefix-len", type=int)
    g.add_argument("--prefix-repetition-prefix-len", type=int)
    g.add_argument("--prefix-repetition-suffix-len", type=int)
    g.add_argument("--prefix-repetition-num-prefixes", type=int)
    g.add_argument("--prefix-repetition-output-len", type=int)
    g.add_argument("--trace-time-scale", type=float, help="replay a trace this many times faster")
    g.add_argument("--tokenizer", help="sharegpt: directory with tokenizer.json that counts the "
                   "conversations' tokens")
    g.add_argument("--sharegpt-output-len", type=int,
                   help="sharegpt: output tokens per request (default: the completion's)")
    g.add_argument("--ramp-up-strategy", choices=["linear", "exponential"],
                   help="ramp the request rate from --ramp-up-start-rps to --ramp-up-end-rps")
    g.add_argument("--ramp-up-start-rps", type=float)
    g.add_argument("--ramp-up-end-rps", type=float)
    g.add_argument("--seed", type=int)
    g = p.add_argument_group("tenants and SLO classes (default: none)")
    g.add_argument("--slo-classes", nargs="+", type=slo_class_def, metavar="NAME:TTFT_MS:TPOT_MS",
                   help="SLO classes requests may carry, e.g. chat:500:50 batch:10000:200 (one "
                   "class alone applies to every request)")
    g.add_argument("--slo-class-mix", nargs="+", type=mix_entry, metavar="NAME:FRACTION",
                   help="the share of requests in each SLO class, e.g. chat:0.3 batch:0.7 "
                   "(default: a trace's slo_class column)")
    g.add_argument("--tenant-mix", nargs="+", type=mix_entry, metavar="NAME:FRACTION",
                   help="the share of requests each tenant sends, e.g. a:0.5 b:0.5 (default: a "
                   "trace's tenant column)")


def slo_class_def(text: str) -> tuple[str, float, float]:
    """``NAME:TTFT_MS:TPOT_MS`` → (name, ttft_ms, tpot_ms)."""
    parts = text.split(":")
    try:
        if len(parts) != 3 or not parts[0]:
            raise ValueError
        return parts[0], float(parts[1]), float(parts[2])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME:TTFT_MS:TPOT_MS (e.g. chat:500:50), got {text!r}"
        ) from None


def mix_entry(text: str) -> tuple[str, float]:
    """``NAME:FRACTION`` → (name, fraction)."""
    name, sep, raw = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME:FRACTION (e.g. chat:0.3), got {text!r}"
        ) from None


# -- value types ----------------------------------------------------------------------------------
#: The largest integer a count, size or seed flag takes (numpy and torch hold them in int64).
MAX_INT = 2**63 - 1
#: The largest byte size a flag takes (1 PiB: beyond any machine; a typo, not a request).
MAX_BYTES = 1 << 50


def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def bounded_int(low: int, high: int = MAX_INT) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        value = _integer(text)
        if not low <= value <= high:
            upper = "" if high == MAX_INT else f" and <= {high:,}"
            raise argparse.ArgumentTypeError(f"must be >= {low}{upper}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


positive_int = bounded_int(1)
nonneg_int = bounded_int(0)
seed = bounded_int(0)  # simulate's rule for seeds: a non-negative integer (numpy/torch: int64)


def finite_float(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
                 high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in the given range (NaN and infinities refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high)
        if not ok:
            lo = "" if low == -math.inf else f"{'(' if low_open else '['}{low:g}, "
            hi = "" if high == math.inf else f"{high:g}{')' if high_open else ']'}"
            where = f" in {lo or '(-inf, '}{hi or 'inf)'}"
            raise argparse.ArgumentTypeError(f"must be a finite number{where}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


positive_float = finite_float(0.0, low_open=True)
nonneg_float = finite_float(0.0)
fraction = finite_float(0.0, 1.0, low_open=True)  # (0, 1]
holdout_fraction = finite_float(0.0, 1.0, high_open=True)  # [0, 1)
load_fraction = positive_float  # of the engine's capacity (> 1: an overload)


def load_fractions(text: str) -> list[float]:
    """``0.15,0.5,0.85`` → load fractions (each finite and > 0)."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated load fractions such as 0.15,0.5,0.85, got {text!r}")
    return [load_fraction(t) for t in items]


def cpu_threads(text: str) -> int:
    """torch CPU threads: 0 (torch's default) up to 4 per CPU of this machine."""
    from engine.resources import cpu_count, max_threads

    value = _integer(text)
    if not 0 <= value <= max_threads():
        raise argparse.ArgumentTypeError(
            f"must be in [0, {max_threads()}] (0: torch's default; at most 4 per CPU, and this "
            f"machine has {cpu_count()}), got {text}")
    return value


def byte_size(text: str) -> int:
    """A byte count as a flag gives it: ``1073741824``, ``512MiB``, ``4GiB``, ``1.5GB`` → bytes
    (finite, positive, at most ``MAX_BYTES``)."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6,
             "gb": 10**9, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "b": 1, "": 1}
    raw = text.strip().lower()
    number = raw.rstrip("kmgib")
    try:
        value = float(number) * units[raw[len(number):]]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes such as 268435456, 256MiB or 4GiB, got {text!r}"
        ) from None
    if not 1 <= value <= MAX_BYTES:  # NaN and infinities fail too
        raise argparse.ArgumentTypeError(
            f"must be a size between 1 byte and 1 PiB, such as 256MiB or 4GiB, got {text!r}")
    return int(value)


def add_cpu_threads_flag(p: argparse.ArgumentParser, default: int | None = 1) -> None:
    """``--cpu-threads`` of the real engine's commands."""
    p.add_argument("--cpu-threads", type=cpu_threads, default=default,
                   help="torch CPU threads (default 1: steadier step times on small machines; "
                   "0 = torch's default; at most 4 per CPU)")


def set_cpu_threads(threads: int | None) -> None:
    """Apply ``--cpu-threads`` (0 or None: leave torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def add_engine_flags(p: argparse.ArgumentParser, parallel: bool = False) -> None:
    """The real engine's flags (the fields of ``engine.llm.EngineArgs``; ``--model`` required),
    with vLLM's names and the older spellings beside them; with ``parallel``, also its layout:
    TP and PP over one worker process per rank."""
    bool_flag = argparse.BooleanOptionalAction
    if parallel:
        g = p.add_argument_group("parallel layout (one worker process per rank)")
        g.add_argument("--tensor-parallel-size", "-tp", type=positive_int,
                       help="ranks per pipeline stage (1)")
        g.add_argument("--pipeline-parallel-size", "-pp", type=positive_int,
                       help="pipeline stages (1)")
        g.add_argument("--distributed-executor-backend", choices=["uni", "mp"],
                       help="uni: the model in this process (one rank only); mp: one worker "
                       "process per rank (default: mp when TP × PP > 1)")
    g = p.add_argument_group("engine (vLLM's names)")
    g.add_argument("--model", required=True, help="local checkpoint directory (HF format)")
    g.add_argument("--dtype", default="auto", help="auto (config.json), float32, float16, bfloat16")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--max-model-len", type=positive_int, help="default: max_position_embeddings")
    g.add_argument("--max-num-batched-tokens", type=positive_int,
                   help="token budget per step (2048)")
    g.add_argument("--max-num-seqs", type=positive_int, help="most running requests (128)")
    g.add_argument("--block-size", type=positive_int, default=16,
                   help="tokens per KV block (16)")
    g.add_argument("--num-gpu-blocks-override", "--num-gpu-blocks", dest="num_gpu_blocks",
                   type=bounded_int(2, 2**31 - 1),
                   help="exact KV block count incl. the null block (overrides sizing)")
    g.add_argument("--kv-cache-memory", type=byte_size,
                   help="KV cache bytes (CPU default 1GiB; CUDA default: profiled)")
    g.add_argument("--gpu-memory-utilization", type=fraction, default=0.9)
    g.add_argument("--enable-prefix-caching", action=bool_flag, default=None,
                   help="prefix caching (default on)")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help=argparse.SUPPRESS)
    g.add_argument("--enable-chunked-prefill", action=bool_flag, default=None,
                   help="chunked prefill (default on)")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                   help=argparse.SUPPRESS)
    g.add_argument("--async-scheduling", action=bool_flag, default=None,
                   help="two batches in flight (default off)")
    g.add_argument("--attention-backend", choices=["triton", "reference"])
    g.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    g.add_argument("--engine-seed", type=seed, default=0, help="seed of unseeded sampling")
    add_policy_flags(g)


def engine_args_from_flags(args: argparse.Namespace) -> EngineArgs:
    """The real engine ``add_engine_flags``' flags describe (torch is imported only now)."""
    from engine.llm import REAL_ENGINE_KNOBS, EngineArgs

    def given(value: bool | None, default: bool) -> bool:
        return default if value is None else value

    knobs = dataclasses.replace(
        REAL_ENGINE_KNOBS,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        enable_chunked_prefill=given(args.enable_chunked_prefill, True),
        async_scheduling=given(args.async_scheduling, False),
        block_size=args.block_size,
        enable_prefix_caching=given(args.enable_prefix_caching, True),
        policy=args.scheduling_policy or REAL_ENGINE_KNOBS.policy,
        policy_options=policy_options_from_flags(args.policy_option) or {},
    )
    layout = {k: v for k in ("tensor_parallel_size", "pipeline_parallel_size",
                             "distributed_executor_backend")
              if (v := getattr(args, k, None)) is not None}  # add_engine_flags(parallel=True)
    return EngineArgs(
        model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        num_gpu_blocks=args.num_gpu_blocks, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, load_format=args.load_format,
        attention_backend=args.attention_backend, seed=args.engine_seed, engine=knobs, **layout,
    )


def add_report_flags(p: argparse.ArgumentParser, run_kind: str = "simulate") -> None:
    """The run-directory and summary flags of a command that runs (``simulate``, ``run-real``)."""
    g = p.add_argument_group("results")
    g.add_argument("--out", help=f"run directory (default runs/{run_kind}-<timestamp>)")
    add_run_dir_flags(g)


def add_run_dir_flags(g: argparse._ArgumentGroup) -> None:
    """What a written run directory holds and what its summary reports (every command that
    writes one: ``simulate``, ``run-real``, ``serve --record-dir``)."""
    g.add_argument("--no-plots", action="store_true", help="skip plot rendering")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000 (ms)")
    g.add_argument("--metric-percentiles", default="99",
                   help="comma-separated percentiles to report (vllm bench's default: 99)")
    g.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="metrics to report percentiles for (ttft,tpot,itl,e2el)")
    g.add_argument("--format", choices=["parquet", "csv"], default="parquet",
                   help="table format in the run directory")


def default_out_dir(prefix: str = "simulate") -> Path:
    """``runs/<prefix>-<timestamp>``: where a run goes without ``--out``."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{prefix}-{stamp}"
