"""``twinserve simulate``: one simulated run, ending in a report (an embedded default without
arguments: Llama-3.1-8B on one H100 with vLLM 0.33.0's online defaults, serving the first 1000
requests of the Azure 2023 conversation trace)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.gc_freeze import frozen_when_done
from experiments.cli.flags import add_report_flags, add_sim_flags, default_out_dir
from experiments.simconfig import config_dict_from_args, load_experiment_file


def _list_catalogs(args: argparse.Namespace) -> bool:
    if args.list_models:
        from sim.model_catalog import catalog

        print(f"{'model':<34} {'architecture':<22} {'layers':>6} {'hidden':>6} {'heads':>5} "
              f"{'kv':>3} {'params':>8} {'active':>7}  features")
        for m in (e.spec for e in catalog().values()):
            print(f"{m.name:<34} {m.architecture:<22} {m.num_layers:>6} {m.hidden_size:>6} "
                  f"{m.num_heads:>5} {m.num_kv_heads:>3} {m.total_params / 1e9:>7.1f}B "
                  f"{m.active_params / 1e9:>6.1f}B  {_features(m)}")
        print("--model also takes a path to a config.json or a model directory "
              "(sim/data/models/SOURCES.md: where each file comes from)")
        return True
    if args.list_gpus:
        from sim.hardware import GPUS

        print(f"{'gpu':<10} {'bf16 TFLOP/s':>12} {'fp8':>6} {'HBM GB':>7} {'TB/s':>5} "
              f"{'link GB/s':>9}  priced by")
        for g in GPUS.values():
            fp8 = f"{g.fp8_tflops:.0f}" if g.fp8_tflops else "-"
            print(f"{g.name:<10} {g.bf16_tflops:>12.0f} {fp8:>6} {g.memory_gb:>7.0f} "
                  f"{g.memory_bw_tbps:>5.2f} {g.nvlink_gbps:>9.0f}  {g.calibration}")
        return True
    if args.list_networks:
        from sim.network import NETWORKS

        print(f"{'network':<15} {'Gb/s per GPU':>12} {'latency us':>10}  description")
        for n in NETWORKS.values():
            print(f"{n.name:<15} {n.bandwidth_gbps:>12.1f} {n.latency_s * 1e6:>10.0f}  "
                  f"{n.display_name}")
        return True
    return False


def _features(m: Any) -> str:
    """What sets a model apart: MoE shape, MLA, sliding windows, checkpoint formats."""
    out = []
    if m.is_moe:
        shared = " + shared" if m.shared_expert_intermediate_size else ""
        out.append(f"MoE {m.num_experts_per_token}/{m.num_experts}{shared}")
    if m.is_mla:
        out.append(f"MLA (latent {m.kv_lora_rank}+{m.qk_rope_head_dim})")
    if m.num_sliding_layers:
        out.append(f"sliding window {m.sliding_window} on {m.num_sliding_layers} layers")
    if m.linear_weight_bytes == 1:
        out.append("fp8 checkpoint")
    if m.expert_weight_bytes is not None:
        out.append("MXFP4 experts")
    return ", ".join(out)


def _explain_step(cfg: Any, spec: str) -> int:
    """Print one step's cost by term (``sim/cost/explain.py``) and exit."""
    from sim.config import resolve_engine_config
    from sim.cost.explain import format_explanation, parse_step
    from sim.runtime import make_cost_model

    shape = parse_step(spec)
    engine = resolve_engine_config(cfg)
    model = make_cost_model(cfg, engine)
    weights = "fp8" if cfg.weight_dtype == "fp8" else "bf16"
    kv = "fp8" if cfg.fp8_kv_cache else "bf16"
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    layout = f"TP {tp}" if pp == 1 else f"TP {tp} × PP {pp}"
    title = (f"step cost ({cfg.resolved_cost_model} cost model) — {cfg.model_spec.name}, "
             f"{tp * pp} × {cfg.gpu} ({layout}), {weights} weights, {kv} KV")
    print(format_explanation(model, shape, title))
    return 0


def _shards(args: argparse.Namespace, cfg: Any) -> int:
    """How many processes the run is split over (``--shards``; 1 where it cannot be split,
    with a note saying why)."""
    shards: int = args.shards
    if shards < 1:
        raise UserError(f"--shards must be >= 1, got {shards}")
    if shards == 1:
        if args.backend != "process" or args.ray_address:
            raise UserError("--backend and --ray-address place the shards of a run: "
                            "give --shards N (N > 1) too")
        return 1
    # imported only here: a one-process run does not pay for the pool's modules
    from experiments.sweep.backends import MAX_JOBS
    from sim.fleet import why_not_shardable

    if shards > MAX_JOBS:
        raise UserError(f"--shards must be <= {MAX_JOBS}, got {shards}")

    why = why_not_shardable(cfg)
    if why is not None:
        print(f"twinserve: not sharding this run: {why}; it runs in one process",
              file=sys.stderr)
        return 1
    return shards


def _simulate_sharded(cfg: Any, shards: int, args: argparse.Namespace) -> Any:
    from experiments.sweep.backends import make_backend, running
    from sim.fleet import simulate_sharded

    # running(): an interruption cancels the shards instead of waiting for them
    with running(make_backend(args.backend, shards, args.ray_address)) as backend:
        return simulate_sharded(cfg, shards, backend.submit_call)


def _simulate(args: argparse.Namespace) -> int:
    if _list_catalogs(args):
        return 0
    with frozen_when_done():  # start-up: see engine/gc_freeze.py
        from sim.config import SimConfig
        from sim.runtime import run_simulation

        base = load_experiment_file(args.config) if args.config else {}
        cfg = SimConfig.from_dict(config_dict_from_args(args, base))
        if args.explain_step:
            return _explain_step(cfg, args.explain_step)
        from experiments.cli.reporting import (
            FinishedRun,
            open_out_dir,
            report_options,
            start_report_process,
            write_run,
        )
        from experiments.resources import check_simulation_memory
        from experiments.run_meta import simulated_run_meta  # (the report process inherits it)

        options = report_options(args)  # parsed now: a bad flag fails before the run
        check_simulation_memory(cfg)
        progress = args.progress if args.progress is not None else sys.stderr.isatty()
        shards = _shards(args, cfg)
    with open_out_dir(Path(args.out) if args.out else default_out_dir()) as out:
        reporter = start_report_process()  # imports the report stack while the run goes on
        try:
            if shards > 1:
                result = _simulate_sharded(cfg, shards, args)
            else:
                result = run_simulation(cfg, progress=progress)
        except BaseException:
            if reporter is not None:
                reporter.close()
            raise
        _note_short_trace(cfg, len(result.workload))
        run = FinishedRun(simulated_run_meta(result), result.event_log)
        del result  # the log is all the report needs: free the rest before rendering it
        write_run(run, out, args, options, reporter)
    return 0


def _note_short_trace(cfg: Any, num_requests: int) -> None:
    """Say so when a trace replayed at its own times had fewer requests than
    ``num_prompts`` asked for (every one of them ran; the summary counts what ran)."""
    if num_requests < cfg.workload.num_prompts and cfg.workload.dataset_name == "trace":
        print(f"twinserve: note: the trace has only {num_requests:,} requests: all "
              f"{num_requests:,} ran (--num-prompts asked for {cfg.workload.num_prompts:,})",
              file=sys.stderr)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate serving a workload; prints the Serving Benchmark Result, writes a report",
        description=__doc__,
    )
    p.add_argument("--config", help="TOML/JSON experiment file (flags override it)")
    p.add_argument("--list-models", action="store_true", help="show the model catalog")
    p.add_argument("--list-gpus", action="store_true", help="show the GPU catalog")
    p.add_argument("--list-networks", action="store_true",
                   help="show the networks between nodes (--network)")
    p.add_argument("--explain-step", metavar="SPEC",
                   help="print one step's cost by term and exit; SPEC: comma-separated "
                   "decode:NxC (N decodes at context C), prefill:Q, prefill:KxQ@C "
                   "(K chunks of Q tokens after C cached), e.g. prefill:512@3584,decode:63x1024")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    g = p.add_argument_group("sharding (data-parallel runs with round_robin, random or "
                             "consistent_hash routing and an open-loop client)")
    g.add_argument("--shards", type=int, default=1,
                   help="split the replicas over N processes and merge their records into the "
                   "run one process writes (default 1; other runs say why they stay in one)")
    g.add_argument("--backend", choices=["process", "ray"], default="process",
                   help="where the shards run: a local process pool (default) or Ray tasks")
    g.add_argument("--ray-address", help="join this Ray cluster (e.g. auto, ray://host:10001) "
                   "instead of starting a local Ray")
    add_sim_flags(p)
    add_report_flags(p)
    p.set_defaults(func=_simulate)
