"""``twinserve plan``: which GPUs and layouts serve this traffic at these SLOs, and how many.

For each candidate (``--gpus`` × ``--tp`` × ``--pp`` × ``--dp`` × ``--knob`` values) find the
highest request rate whose SLO attainment (``--slo ttft:500 tpot:50``, ``--attainment 99``)
holds for every seed; with ``--target-rate R``, the fewest replicas (GPUs = TP × PP × replicas)
that serve R.
The model, workload shape (``--dataset-name``/``--dataset-path``, lengths, ``--burstiness``,
``--num-prompts``) and fixed engine knobs come from the simulate flags or ``--config``.
Writes plan.csv, plan.md and probes.csv, and prints the top rows. Example::

    twinserve plan --model meta-llama/Llama-3.1-8B --gpus h100-sxm a100-80gb --tp 1 2 \\
        --dataset-name trace --dataset-path azure-conv --num-prompts 400 \\
        --slo ttft:500 tpot:50 --attainment 99 --target-rate 20 \\
        --gpu-price h100-sxm=2.5 a100-80gb=1.6 --out runs/plan
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from engine.core.errors import UserError


def _values(text: str) -> list[Any]:
    out: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        try:
            out.append(json.loads(item))
        except json.JSONDecodeError:
            out.append(item)
    return out


def parse_knobs(items: list[str] | None) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """``["max_num_batched_tokens=2048,8192"]`` → ((engine.max_num_batched_tokens, (…)),)."""
    from experiments.sweep.expfile import resolve_key

    knobs = []
    for item in items or []:
        key, sep, values = item.partition("=")
        if not sep or not values:
            raise UserError(f"invalid --knob {item!r}: use KEY=V1,V2 (e.g. "
                            "max_num_batched_tokens=2048,8192)")
        path = resolve_key(key)
        if path in ("workload.request_rate", "workload.seed"):
            raise UserError(
                f"--knob {key}: plan searches the request rate and sets the seeds itself "
                "(see --rate-start, --seeds)"
            )
        knobs.append((path, tuple(_values(values))))
    return tuple(knobs)


def parse_prices(items: list[str] | None) -> dict[str, float]:
    prices = {}
    for item in items or []:
        gpu, sep, value = item.partition("=")
        try:
            prices[gpu] = float(value)
        except ValueError:
            sep = ""
        if not sep or not 0 <= prices.get(gpu, -1) < math.inf:
            raise UserError(f"invalid --gpu-price {item!r}: use GPU=USD_PER_HOUR, e.g. "
                            "h100-sxm=2.5")
    return prices


def build_spec(args: argparse.Namespace) -> Any:
    from experiments.plan.capacity import SearchSettings
    from experiments.plan.planner import PlanSpec
    from experiments.simconfig import config_dict_from_args, load_experiment_file
    from reports.options import parse_goodput

    if args.request_rate is not None:
        raise UserError("plan searches the request rate: drop --request-rate (see "
                        "--rate-start, --target-rate)")
    base = load_experiment_file(args.config) if args.config else {}
    base = config_dict_from_args(args, base)
    base.get("workload", {}).pop("trace_rate_given", None)
    try:
        slos = parse_goodput(args.slo)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    attainment = args.attainment / 100 if args.attainment > 1 else args.attainment
    try:
        search = SearchSettings(rate_start=args.rate_start, rate_min=args.rate_min,
                                rate_max=args.rate_max, tolerance=args.tolerance,
                                max_probes=args.max_probes)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    gpus = tuple(args.gpus or [base.get("gpu", "h100-sxm")])
    tps = tuple(args.tp or [base.get("tensor_parallel_size", 1)])
    pps = tuple(args.pp or [base.get("pipeline_parallel_size", 1)])
    return PlanSpec(
        base=base, gpus=gpus, tp_sizes=tps, dp_sizes=tuple(args.dp or [1]), pp_sizes=pps,
        knobs=parse_knobs(args.knob), slos_ms=slos, attainment=attainment,
        seeds=tuple(range(args.seeds)), search=search, target_rate=args.target_rate,
        max_replicas=args.max_replicas, gpu_prices=parse_prices(args.gpu_price),
    )


def _plan(args: argparse.Namespace) -> int:
    from experiments.plan.planner import run_plan
    from experiments.plan.report import plan_rows, probe_rows, shown, write_plan
    from experiments.sweep.backends import make_backend
    from experiments.sweep.report import markdown_table
    from experiments.sweep.runner import ResultCache

    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    from experiments.sweep.backends import check_jobs

    check_jobs(args.jobs)
    if not 1 <= args.seeds <= 1000:
        raise UserError(f"--seeds must be in [1, 1000], got {args.seeds}")
    spec = build_spec(args)
    from experiments.cli.reporting import prepare_out_dir

    out = prepare_out_dir(Path(args.out) if args.out else Path("runs") / "plan")
    candidates = spec.candidates()
    print(f"plan: {len(candidates)} candidate(s) × {len(spec.seeds)} seed(s)", file=sys.stderr)

    def done(o: Any) -> None:
        if o.capacity is None:
            print(f"  {o.candidate.label}: invalid ({o.error})", file=sys.stderr)
            return
        extra = f", {o.replicas} replica(s) for the target" if o.replicas else ""
        print(f"  {o.candidate.label}: {o.capacity.status}, max {o.capacity.max_rate:.3g} "
              f"req/s ({len(o.capacity.probes)} probes){extra}", file=sys.stderr)

    backend = make_backend(args.backend, args.jobs, args.ray_address)
    try:
        outcomes, ev = run_plan(spec, backend, ResultCache(out / "cache"), on_done=done)
    finally:
        backend.close()
    df = plan_rows(spec, ev, outcomes)
    workload = json.dumps(spec.base.get("workload", {}))
    write_plan(spec, df, probe_rows(ev), out, workload)
    if all(o.capacity is None for o in outcomes):
        raise UserError(
            f"no candidate layout can run ({outcomes[0].candidate.label}: {outcomes[0].error}"
            + (f"; and {len(outcomes) - 1} more" if len(outcomes) > 1 else "")
            + f"); see {out / 'plan.md'}"
        )
    print(markdown_table(shown(df).head(args.top)))
    print(f"{ev.num_sims} simulation(s) run; plan: {out / 'plan.md'} (+ plan.csv, probes.csv)",
          file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    from experiments.cli.flags import add_sim_flags

    p = sub.add_parser(
        "plan", help="capacity planning: max rate per layout at SLOs, fewest GPUs for a rate",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="TOML/JSON base config (flags override it)")
    g = p.add_argument_group("candidates")
    g.add_argument("--gpus", nargs="+", help="candidate GPUs (default: --gpu or h100-sxm)")
    g.add_argument("--tp", nargs="+", type=int, help="candidate TP sizes (default 1)")
    g.add_argument("--pp", nargs="+", type=int,
                   help="candidate pipeline-parallel sizes (default 1)")
    g.add_argument("--dp", nargs="+", type=int, help="candidate replica counts (default 1; "
                   "solved instead with --target-rate)")
    g.add_argument("--knob", action="append", metavar="KEY=V1,V2",
                   help="candidate values of a config key (repeatable), e.g. "
                   "max_num_batched_tokens=2048,8192")
    g = p.add_argument_group("SLOs and search")
    g.add_argument("--slo", nargs="+", default=["ttft:500", "tpot:50"], metavar="KEY:MS",
                   help="SLOs every counted request must meet (default ttft:500 tpot:50)")
    g.add_argument("--attainment", type=float, default=99.0,
                   help="percent (or fraction) of requests that must meet the SLOs (99)")
    g.add_argument("--seeds", type=int, default=3, help="seeds per probed rate (3)")
    g.add_argument("--tolerance", type=float, default=0.05,
                   help="stop when the rate bracket is within this fraction (0.05)")
    g.add_argument("--rate-start", type=float, default=1.0,
                   help="first rate probed, per replica (req/s)")
    g.add_argument("--rate-min", type=float, default=0.01)
    g.add_argument("--rate-max", type=float, default=10_000.0)
    g.add_argument("--max-probes", type=int, default=30, help="probes per search at most")
    g.add_argument("--target-rate", type=float, help="find the fewest GPUs serving this rate")
    g.add_argument("--max-replicas", type=int, default=16)
    g.add_argument("--gpu-price", nargs="+", metavar="GPU=USD",
                   help="$ per GPU-hour, e.g. h100-sxm=2.5 (adds cost columns)")
    g = p.add_argument_group("execution and output")
    g.add_argument("--out", help="output directory (default runs/plan)")
    g.add_argument("--jobs", "-j", type=int, help="parallel simulations (default: all CPUs)")
    g.add_argument("--backend", choices=["process", "ray"], default="process")
    g.add_argument("--ray-address", help="join this Ray cluster instead of a local Ray")
    g.add_argument("--top", type=int, default=10, help="rows to print (10)")
    add_sim_flags(p)
    p.set_defaults(func=_plan)
