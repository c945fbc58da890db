"""``twinserve plan``: which GPUs and layouts serve this traffic at these SLOs, and how many.

With ``--num-gpus N`` every layout N GPUs of each ``--gpus`` kind can hold is a candidate
(TP × PP × expert parallelism × ``--quantizations``; replicas fill the budget); otherwise the
candidates are ``--gpus`` × ``--tp`` × ``--pp`` × ``--dp``. ``--knob`` values multiply either. Each
candidate is estimated by the cost model first (the analytic pre-screen prunes what cannot win,
on by default with a budget), then its highest request rate whose SLO attainment (``--slo
ttft:500 tpot:50``, ``--attainment 99``) holds for every seed is searched from that estimate;
seeds run only while the confidence interval leaves the verdict open. With ``--target-rate R``,
the fewest replicas that serve R. The best layout's deployment is simulated as a whole before
it is recommended. The model, workload shape (``--dataset-name``/``--dataset-path``, lengths,
``--burstiness``, ``--num-prompts``) and fixed engine knobs come from the simulate flags or
``--config``. Writes plan.csv, plan.md, probes.csv, front.csv and front.png (the Pareto fronts
of throughput per GPU against tokens/s per user and against TTFT, with the ``vllm serve`` and
``twinserve serve`` command of every point), and prints the top rows and the recommendation.
Examples::

    twinserve plan --model meta-llama/Llama-3.1-70B --gpus h100-sxm h200-sxm --num-gpus 8 \\
        --quantizations none fp8 --slo ttft:1000 tpot:50 --num-prompts 300 --out runs/plan
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
        tolerance = args.tolerance
        if tolerance is None:  # a budget's front needs breadth more than resolution
            tolerance = 0.1 if args.num_gpus is not None else 0.05
        search = SearchSettings(rate_start=args.rate_start or 1.0, rate_min=args.rate_min,
                                rate_max=args.rate_max, tolerance=tolerance,
                                max_probes=args.max_probes)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.num_gpus is not None and (args.tp or args.dp):
        raise UserError("--num-gpus enumerates the layouts itself: drop --tp/--dp (or drop "
                        "--num-gpus to list candidates)")
    if args.num_gpus is not None and args.target_rate is not None:
        raise UserError("--num-gpus fixes the GPUs and --target-rate solves for them: give one")
    fractions = tuple(args.front_fractions)
    if any(not 0 < f < 1 for f in fractions):
        raise UserError(f"--front-fractions must be in (0, 1), got {list(fractions)}")
    gpus = tuple(args.gpus or [base.get("gpu", "h100-sxm")])
    tps = tuple(args.tp or [base.get("tensor_parallel_size", 1)])
    pps = tuple(args.pp or [base.get("pipeline_parallel_size", 1)])
    return PlanSpec(
        base=base, gpus=gpus, tp_sizes=tps, dp_sizes=tuple(args.dp or [1]), pp_sizes=pps,
        knobs=parse_knobs(args.knob), slos_ms=slos, attainment=attainment,
        seeds=tuple(range(args.seeds)), search=search, target_rate=args.target_rate,
        max_replicas=args.max_replicas, gpu_prices=parse_prices(args.gpu_price),
        num_gpus=args.num_gpus,
        quantizations=parse_quantizations(args.quantizations),
        expert_parallel=args.expert_parallel, prescreen=args.prescreen,
        start_from_estimate=args.rate_start is None, front_fractions=fractions,
    )


def parse_quantizations(items: list[str] | None) -> tuple[str | None, ...]:
    """``--quantizations none fp8`` → (None, "fp8") (none/auto: the checkpoint's dtype)."""
    out: list[str | None] = []
    for item in items or ["none"]:
        if item.lower() in ("none", "auto", "bf16", "bfloat16"):
            out.append(None)
        elif item.lower() == "fp8":
            out.append("fp8")
        else:
            raise UserError(f"invalid --quantizations value {item!r}: use none or fp8")
    return tuple(dict.fromkeys(out))


def workload_shape(spec: Any) -> Any:
    """Mean prompt and output lengths of the base workload (seed 0), for the estimates."""
    from experiments.plan.estimate import workload_shape as shape_of
    from experiments.simconfig import config_dict_from_args
    from experiments.sweep.expfile import set_key
    from sim.config import SimConfig
    from workload.build import build_workload

    user = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.base.items()}
    set_key(user, "workload.request_rate", 1.0)
    cfg = SimConfig.from_dict(config_dict_from_args(argparse.Namespace(), user))
    return shape_of(build_workload(cfg.workload))


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
            status = "pruned" if o.pruned else "invalid"
            print(f"  {o.candidate.label}: {status} ({o.error})", file=sys.stderr)
            return
        extra = f", {o.replicas} replica(s) for the target" if o.replicas else ""
        print(f"  {o.candidate.label}: {o.capacity.status}, max {o.capacity.max_rate:.3g} "
              f"req/s ({len(o.capacity.probes)} probes){extra}", file=sys.stderr)

    shape = workload_shape(spec)
    backend = make_backend(args.backend, args.jobs, args.ray_address)
    try:
        outcomes, ev = run_plan(spec, backend, ResultCache(out / "cache"), on_done=done,
                                shape=shape)
        from experiments.plan.deploy import recommend

        deployment = recommend(spec, ev, outcomes)
    finally:
        backend.close()
    df = plan_rows(spec, ev, outcomes)
    workload = json.dumps(spec.base.get("workload", {}))
    write_plan(spec, df, probe_rows(ev), out, workload)
    from experiments.plan.report import write_front

    recommendation = write_front(spec, ev, deployment, out)
    if all(o.capacity is None for o in outcomes):
        raise UserError(
            f"no candidate layout can run ({outcomes[0].candidate.label}: {outcomes[0].error}"
            + (f"; and {len(outcomes) - 1} more" if len(outcomes) > 1 else "")
            + f"); see {out / 'plan.md'}"
        )
    print(markdown_table(shown(df).head(args.top)))
    for r in df.head(args.top).itertuples():
        if "short run:" in str(getattr(r, "note", "")):
            print(f"warning: {r.candidate}: {r.note}", file=sys.stderr)
    if recommendation:
        print(recommendation)
    print(f"{ev.num_sims} simulation(s) run; plan: {out / 'plan.md'} (+ plan.csv, probes.csv, "
          "front.csv, front.png)", file=sys.stderr)
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
    g.add_argument("--num-gpus", type=int, help="GPU budget per kind: plan every layout it "
                   "holds (TP × PP × EP × --quantizations; replicas fill the budget)")
    g.add_argument("--quantizations", nargs="+", metavar="Q",
                   help="with --num-gpus: weight dtypes, none (the checkpoint's) and/or fp8")
    g.add_argument("--expert-parallel", choices=["auto", "on", "off"], default="auto",
                   help="with --num-gpus, MoE models: both layouts (auto), only EP, or none")
    g.add_argument("--prescreen", action=argparse.BooleanOptionalAction, default=None,
                   help="prune candidates the cost model's estimate rules out (default: on "
                   "with --num-gpus)")
    g.add_argument("--tp", nargs="+", type=int, help="candidate TP sizes (default 1)")
    g.add_argument("--pp", nargs="+", type=int,
                   help="candidate pipeline-parallel sizes (default 1; with --num-gpus: the "
                   "PP sizes the budget's layouts may use)")
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
    g.add_argument("--tolerance", type=float,
                   help="stop when the rate bracket is within this fraction (0.05; 0.1 with "
                   "--num-gpus)")
    g.add_argument("--rate-start", type=float,
                   help="first rate probed, per replica (req/s; default: the cost model's "
                   "capacity estimate)")
    g.add_argument("--front-fractions", nargs="+", type=float, default=[0.3],
                   help="extra probes per layout at these fractions of its capacity, for the "
                   "lighter-load end of the Pareto front (0.3)")
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
