"""``twinserve serve``: an OpenAI-compatible server with vLLM V1's process layout.

``twinserve serve --model DIR`` serves a local checkpoint on the torch worker;
``twinserve serve --emulate --model CATALOG-NAME --gpu GPU -tp N`` serves the same API from an
emulated device that takes the simulator's step times on the real clock. Engine flags carry
vLLM's names; ``--record-dir DIR`` makes the shutdown write a run directory that
``twinserve report`` reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.events import EventKind
from experiments.cli.cmd_topology import add_layout_flags
from experiments.cli.flags import (
    add_policy_flags,
    add_run_dir_flags,
    byte_size,
    policy_options_from_flags,
)

#: The text whose tokens an emulated device cycles through as its outputs.
EMULATED_OUTPUT_TEXT = (
    "The engine schedules requests step by step. Each step computes a batch of tokens: new "
    "prompts are prefilled in chunks, running requests decode one token at a time, and the "
    "scheduler keeps the key-value cache in fixed-size blocks. "
)
#: Vocabulary of the tokenizer an emulated model gets when none is given.
EMULATED_TOKENIZER_VOCAB = 512

#: Engine flags of the real engine only / of the emulated one only (dest names).
REAL_ONLY = ("dtype", "device", "kv_cache_memory", "load_format", "attention_backend",
             "cpu_threads", "engine_cpus", "profile_out", "profile_grid", "step_shapes_out",
             "pipeline_parallel_size", "distributed_executor_backend")
EMULATED_ONLY = ("gpu", "cost_model", "quantization", "kv_cache_dtype", "enable_expert_parallel")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_mode_flags(args: argparse.Namespace) -> None:
    wrong = EMULATED_ONLY if not args.emulate else REAL_ONLY
    given = [d for d in wrong if getattr(args, d) is not None]
    if given:
        need = "--emulate" if not args.emulate else "a real model (no --emulate)"
        raise UserError(f"{_flag(given[0])} needs {need}")


def _sim_config(args: argparse.Namespace) -> Any:
    """The simulated deployment an emulated server runs (vLLM's per-GPU defaults)."""
    from sim.config import SimConfig

    engine = {
        "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "policy": args.scheduling_policy, "async_scheduling": args.async_scheduling,
        "block_size": args.block_size, "enable_prefix_caching": args.enable_prefix_caching,
        "policy_options": policy_options_from_flags(args.policy_option),
    }
    top = {
        "model": args.model, "gpu": args.gpu, "tensor_parallel_size": args.tensor_parallel_size,
        "quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype,
        "enable_expert_parallel": args.enable_expert_parallel,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "num_gpu_blocks": args.num_gpu_blocks_override, "max_model_len": args.max_model_len,
        "frontend": {"num_api_servers": args.api_server_count or args.data_parallel_size or 1},
    }
    if args.cost_model is not None and _fixed_step_s(args.cost_model) is None:
        top["cost_model"] = args.cost_model
    values = {k: v for k, v in top.items() if v is not None}
    values["engine"] = {k: v for k, v in engine.items() if v is not None}
    return SimConfig.from_dict(values)


def _fixed_step_s(cost_model: str | None) -> float | None:
    """``zero`` -> 0 s, ``fixed:SECONDS`` -> SECONDS, anything else -> None."""
    if cost_model == "zero":
        return 0.0
    if cost_model is None or not cost_model.startswith("fixed:"):
        return None
    text = cost_model.split(":", 1)[1]
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--cost-model fixed:SECONDS needs a number, got {text!r}") from None
    if not 0.0 <= value <= 3600.0:  # NaN fails too
        raise UserError(f"--cost-model fixed:SECONDS must be in [0, 3600], got {text}")
    return value


def _check_policy(scheduler: Any) -> None:
    """Build the scheduling policy once here, as the EngineCore process will, so a bad name,
    class or option — or a policy that needs SLOs, which served requests do not carry — is
    one error line before any process starts."""
    from engine.core.policy import PolicyContext, build_policy
    from engine.entrypoints.engine_proc import SERVED_STREAM

    build_policy(PolicyContext(scheduler, SERVED_STREAM))


def _engine_args(args: argparse.Namespace) -> Any:
    from engine.llm import EngineArgs

    given = {
        "tokenizer": args.tokenizer, "dtype": args.dtype, "device": args.device,
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_seqs": args.max_num_seqs, "block_size": args.block_size,
        "enable_prefix_caching": args.enable_prefix_caching,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "async_scheduling": args.async_scheduling,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "policy": args.scheduling_policy, "num_gpu_blocks": args.num_gpu_blocks_override,
        "policy_options": policy_options_from_flags(args.policy_option),
        "kv_cache_memory": args.kv_cache_memory,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "load_format": args.load_format, "attention_backend": args.attention_backend,
        "seed": args.seed, "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "distributed_executor_backend": args.distributed_executor_backend,
    }
    return EngineArgs.from_kwargs(args.model,
                                  **{k: v for k, v in given.items() if v is not None})


def _check_devices(engine_args: Any, data_parallel_size: int) -> None:
    """On CUDA, one device per rank of every replica (TP × PP × DP)."""
    from engine.core.parallel import check_device_count
    from engine.worker.loader import resolve_device

    device = resolve_device(engine_args.device)
    if device.type != "cuda":
        return
    import torch

    ranks = engine_args.parallel_config.world_size * data_parallel_size
    check_device_count(ranks + (device.index or 0), torch.cuda.device_count())


def _cpu_list(text: str) -> tuple[int, ...]:
    """``0``, ``0,2`` or ``0-3`` → CPU numbers."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CPU numbers like 0, 0,2 or 0-3, got {text!r}") from None
    return tuple(sorted(set(cpus)))


def _real_factory(args: argparse.Namespace, engine_args: Any, threads: int) -> Any:
    """The checkpoint's engine; profiled in place, recorded step by step or pinned when asked
    (``twinserve validate`` asks: ``experiments.validation.served_engine``)."""
    from experiments.serve.engines import RealEngineFactory

    if not (args.profile_out or args.step_shapes_out or args.engine_cpus):
        return RealEngineFactory(engine_args, threads)
    from experiments.validation.served_engine import ProfiledEngineFactory, ProfileRequest

    if args.engine_cpus and not set(args.engine_cpus) <= os.sched_getaffinity(0):
        raise UserError(f"--engine-cpus {','.join(map(str, args.engine_cpus))}: this process "
                        f"may run on CPUs {sorted(os.sched_getaffinity(0))} only")
    profile = (ProfileRequest(args.profile_out, args.profile_grid or "full")
               if args.profile_out else None)
    return ProfiledEngineFactory(engine_args, threads, args.engine_cpus or None, profile,
                                 args.step_shapes_out)


def _emulated_tokenizer(args: argparse.Namespace, workdir: Path) -> str:
    """The emulated model's tokenizer directory: ``--tokenizer``, or a built-in one."""
    if args.tokenizer is not None:
        return str(args.tokenizer)
    from engine.worker.tiny_tokenizer import build_tokenizer_files

    build_tokenizer_files(workdir, "llama", EMULATED_TOKENIZER_VOCAB)
    return str(workdir)


def _token_cycle(tokenizer_dir: str, vocab_size: int) -> tuple[int, ...]:
    """Plain tokens of a fixed text (no special or out-of-vocabulary ids)."""
    from engine.serve.frontend import Tokenizer

    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    special = {tokenizer.eos_token_id, tokenizer.bos_token_id}
    ids = tokenizer.encode(EMULATED_OUTPUT_TEXT, add_special_tokens=False)
    cycle = tuple(t for t in ids if t not in special and 0 <= t < vocab_size)
    if not cycle:
        raise UserError(f"the tokenizer in {tokenizer_dir} yields no plain token for the "
                        "emulated outputs")
    return cycle


def _serve(args: argparse.Namespace) -> int:
    from engine.entrypoints.launcher import Launcher, ServeConfig

    _check_mode_flags(args)
    dp = 1 if args.data_parallel_size is None else args.data_parallel_size
    api_servers = dp if args.api_server_count is None else args.api_server_count
    if args.record_dir is not None and dp > 1:
        raise UserError("--record-dir records one engine; with --data-parallel-size > 1 it "
                        "is not supported yet")
    per_engine = [f for f in ("profile_out", "step_shapes_out", "engine_cpus")
                  if getattr(args, f, None)]
    if per_engine and dp > 1:
        raise UserError(f"{_flag(per_engine[0])} profiles or pins one engine; with "
                        "--data-parallel-size > 1 it is not supported yet")
    api_key = args.api_key or os.environ.get("TWINSERVE_API_KEY") or None
    options = None
    if args.record_dir is not None:
        from experiments.cli.reporting import prepare_out_dir, report_options

        options = report_options(args)
        prepare_out_dir(Path(args.record_dir))
    with tempfile.TemporaryDirectory(prefix="twinserve-serve-") as work:
        if args.emulate:
            from sim.emulation import EmulatedEngineFactory

            sim_config = _sim_config(args)
            tokenizer_dir: str | None = _emulated_tokenizer(args, Path(work))
            assert tokenizer_dir is not None
            cycle = _token_cycle(tokenizer_dir, sim_config.model_spec.vocab_size)
            factory: Any = EmulatedEngineFactory(sim_config, cycle,
                                                 _fixed_step_s(args.cost_model))
            engine_config = factory.engine_config()
            _check_policy(engine_config.scheduler)
            engine_meta: dict[str, Any] = {"sim_config": sim_config.to_dict()}
        else:
            from engine.serve.frontend import Tokenizer
            from engine.worker.model_config import load_model_config

            engine_args = _engine_args(args)
            model_config = load_model_config(args.model)
            # validates early
            _check_policy(engine_args.scheduler_config(model_config))
            engine_args.parallel_config.check_model(
                model_config.num_attention_heads, model_config.num_key_value_heads,
                model_config.num_hidden_layers, args.model)
            _check_devices(engine_args, dp)
            tokenizer_dir = args.tokenizer or args.model
            if not Tokenizer.has_tokenizer(tokenizer_dir):
                tokenizer_dir = None
            threads = 1 if args.cpu_threads is None else args.cpu_threads
            factory = _real_factory(args, engine_args, threads)
            engine_config = None
            engine_meta = {
                "engine_args": {k: getattr(engine_args, k)
                                for k in engine_args.__dataclass_fields__ if k != "engine"},
                "engine": dataclasses.asdict(engine_args.engine),
            }
        cfg = ServeConfig(
            served_model_name=args.served_model_name or args.model, model_root=args.model,
            tokenizer_dir=tokenizer_dir, host=args.host, port=args.port,
            api_server_count=api_servers, api_key=api_key,
            record_dir=args.record_dir, shutdown_timeout_s=args.shutdown_timeout,
            engine_death_grace_s=args.engine_death_grace,
            log_level=args.uvicorn_log_level, data_parallel_size=dp,
            router=args.router or "vllm",
            router_load_cap=8 if args.router_load_cap is None else args.router_load_cap,
        )

        def ready(url: str) -> None:
            engines = "1 engine" if dp == 1 else f"{dp} engines"
            print(f"twinserve: serving {cfg.served_model_name} on {url} "
                  f"({cfg.api_server_count} API server(s), {engines})", file=sys.stderr,
                  flush=True)

        launcher = Launcher(cfg, factory, on_ready=ready)
        status = launcher.run()
    if args.record_dir is not None and status == 0:
        _write_run_dir(args, cfg, engine_meta, engine_config, options)
    return status


def _write_run_dir(args: argparse.Namespace, cfg: Any, engine_meta: dict[str, Any],
                   engine_config: Any, options: Any) -> None:
    from experiments.cli.reporting import FinishedRun, write_run
    from experiments.run_meta import served_run_meta
    from experiments.serve.run_dir import joined_log, read_records, served_tables
    from reports.tables import ExportedLog

    out = Path(args.record_dir)
    records = read_records(out / "records", cfg.api_server_count)
    joined = joined_log(records)
    if not joined["req_ids"]:
        print("twinserve: no request was served: no run directory written", file=sys.stderr)
        return
    num_rejected = sum(1 for k in joined["events"]["kind"] if k == EventKind.REJECTED)
    meta = served_run_meta(
        mode="emulated" if args.emulate else "served",
        served_model_name=cfg.served_model_name,
        api_server_count=cfg.api_server_count,
        serve_config={"api_server_count": cfg.api_server_count, "host": cfg.host,
                      "port": cfg.port},
        engine_meta=engine_meta,
        engine_config=engine_config,
        engine=records.engine,
        num_requests=len(joined["req_ids"]),
        num_rejected=num_rejected,
        num_steps=len(joined["steps"]["step_id"]),
        duration_s=max(joined["events"]["time_s"], default=0.0),
    )
    served = served_tables(records, joined)
    write_run(FinishedRun(meta, ExportedLog(joined)), out, args, options)
    for name, table in zip(("served_requests", "served_steps"), served, strict=True):
        if args.format == "parquet":
            table.to_parquet(out / f"{name}.parquet", index=False)
        else:
            table.to_csv(out / f"{name}.csv", index=False)


def register(sub: Any) -> None:
    bool_flag = argparse.BooleanOptionalAction
    p = sub.add_parser(
        "serve",
        help="serve an OpenAI-compatible API (API server processes + an EngineCore process)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("server")
    g.add_argument("--model", required=True,
                   help="checkpoint directory; with --emulate a catalog model "
                   "(twinserve simulate --list-models)")
    g.add_argument("--served-model-name", help="the name clients use (default: --model)")
    g.add_argument("--tokenizer", help="directory with tokenizer.json (default: the model's; "
                   "with --emulate a built-in 512-token vocabulary)")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="port (8000; 0 = any free port)")
    g.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/* "
                   "(default: $TWINSERVE_API_KEY)")
    g.add_argument("--record-dir", help="at shutdown, write a run directory here "
                   "(twinserve report reads it)")
    g.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="seconds in-flight requests get at shutdown (5)")
    g.add_argument("--engine-death-grace", type=float, default=2.0,
                   help="if the EngineCore dies, seconds the API servers keep answering "
                   "(/health 503, errors) before the server exits with status 1 (2)")
    g.add_argument("--uvicorn-log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"])
    g = p.add_argument_group("parallel layout (twinserve topology prints the processes)")
    add_layout_flags(g)
    g.add_argument("--router", help="with -dp: how API servers pick an engine: vllm "
                   "(default), round_robin, least_outstanding, least_kv, prefix_aware")
    g.add_argument("--router-load-cap", type=int,
                   help="prefix_aware: extra in-flight requests tolerated for a better hit (8)")
    g = p.add_argument_group("engine (vLLM's names; default: vLLM's)")
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--max-num-batched-tokens", type=int)
    g.add_argument("--max-num-seqs", type=int)
    g.add_argument("--block-size", type=int)
    g.add_argument("--num-gpu-blocks-override", type=int, help="KV blocks incl. the null block")
    g.add_argument("--gpu-memory-utilization", type=float)
    g.add_argument("--enable-prefix-caching", action=bool_flag, default=None)
    g.add_argument("--enable-chunked-prefill", action=bool_flag, default=None)
    g.add_argument("--async-scheduling", action=bool_flag, default=None)
    g.add_argument("--long-prefill-token-threshold", type=int)
    add_policy_flags(g)
    g.add_argument("--seed", type=int, help="engine-wide sampling seed")
    g = p.add_argument_group("real model")
    g.add_argument("--dtype", help="auto (config.json), float32, float16, bfloat16")
    g.add_argument("--device", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--kv-cache-memory", type=byte_size,
                   help="KV cache bytes, e.g. 64MiB (CPU default 1GiB; CUDA: profiled)")
    g.add_argument("--load-format", choices=["safetensors", "dummy"])
    g.add_argument("--attention-backend", choices=["triton", "reference"])
    g.add_argument("--cpu-threads", type=int,
                   help="torch CPU threads of the EngineCore (default 1: steadier steps beside "
                   "the API servers on small machines; 0 = torch's default)")
    g.add_argument("--engine-cpus", type=_cpu_list,
                   help="pin the EngineCore process (and its threads) to these CPUs, e.g. 0")
    g.add_argument("--profile-out", help="before serving, profile the engine's step grid, "
                   "wake-up and speed probes inside the EngineCore process into this profile "
                   "CSV (with .meta.json; twinserve validate does)")
    g.add_argument("--profile-grid", choices=["full", "quick", "gpu"],
                   help="the grid of --profile-out (full)")
    g.add_argument("--step-shapes-out", help="at shutdown, write every served step's batch "
                   "shape and measured time to this CSV")
    g = p.add_argument_group("emulation (the simulator's cost model on the real clock)")
    g.add_argument("--emulate", action="store_true",
                   help="emulate --model (a catalog name or a config.json / model directory) "
                   "on --gpu with -tp GPUs")
    g.add_argument("--gpu", help="catalog GPU (twinserve simulate --list-gpus; default h100-sxm)")
    g.add_argument("--quantization", help="fp8: fp8 weights, W8A8 GEMMs (vLLM's flag)")
    g.add_argument("--kv-cache-dtype", help="auto or fp8 (vLLM's flag)")
    g.add_argument("--enable-expert-parallel", action="store_true", default=None,
                   help="MoE models: experts spread over the TP ranks (vLLM's flag)")
    g.add_argument("--cost-model", help="auto (default: the vLLM step model where the GPU has "
                   "measured kernel tables, else the roofline), vllm, roofline, fitted:PATH, "
                   "fixed:SECONDS (every step takes that long) or zero (no time: the serving "
                   "path's own latency)")
    add_run_dir_flags(p.add_argument_group("the run directory (with --record-dir)"))
    p.set_defaults(func=_serve)
