"""Subcommands over run directories: ``report`` (rebuild a run's report) and ``compare``.

Both read only the run directories' files (never the simulator). Report options are spelled as
``vllm bench serve`` spells them (``--goodput ttft:MS tpot:MS e2el:MS``, ``--metric-percentiles``,
``--percentile-metrics``, ``--save-detailed``). pandas and matplotlib are imported only when a
command runs, so ``twinserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from engine.core.errors import UserError


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """The report flags of vllm bench serve (+ ``--no-plots``); each defaults to None: keep
    what the run was reported with."""
    p.add_argument(
        "--goodput", nargs="+", metavar="KEY:MS", default=None,
        help='service level objectives for goodput as "KEY:VALUE" pairs, KEY one of ttft, '
        "tpot, e2el and VALUE in milliseconds (e.g. --goodput ttft:500 tpot:50)",
    )
    p.add_argument(
        "--metric-percentiles", default=None, metavar="P,P,...",
        help='comma-separated percentiles to report (vllm bench default "99")',
    )
    p.add_argument(
        "--percentile-metrics", default=None, metavar="M,M,...",
        help='comma-separated metrics to report percentiles for, from ttft, tpot, itl, e2el '
        '(vllm bench default "ttft,tpot,itl")',
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--save-detailed", action="store_true", default=None,
        help="also write the per-request arrays (ttfts, itls, latencies …) to summary.json",
    )


def report_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for ``rebuild_report`` (None: keep the previous option)."""
    from reports.options import parse_goodput, parse_percentile_metrics, parse_percentiles

    opts: dict[str, Any] = {
        "goodput": None if args.goodput is None else parse_goodput(args.goodput),
        "percentiles": None if args.metric_percentiles is None
        else parse_percentiles(args.metric_percentiles),
        "percentile_metrics": None if args.percentile_metrics is None
        else parse_percentile_metrics(args.percentile_metrics),
        "plots": not args.no_plots,
        "detailed": args.save_detailed,
    }
    return opts


def _user_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the reports package's input errors into the CLI's one-line ``UserError``."""

    def wrapper(args: argparse.Namespace) -> int:
        from reports.errors import ReportError

        try:
            return func(args)
        except ReportError as exc:
            raise UserError(str(exc)) from exc
        except json.JSONDecodeError as exc:
            raise UserError(f"a run-directory JSON file is not valid JSON: {exc}") from exc

    return wrapper


@_user_errors
def _report(args: argparse.Namespace) -> int:
    from reports.metrics import format_summary
    from reports.run_dir import rebuild_report

    summary = rebuild_report(args.run_dir, **report_options(args))
    print(format_summary(summary))
    print(f"Diagnosis: {summary['diagnosis']['verdict']}")
    print(summary["diagnosis"]["text"])
    print(f"Report: {args.run_dir}/report.md, {args.run_dir}/report.html")
    return 0


@_user_errors
def _compare(args: argparse.Namespace) -> int:
    from reports.compare import compare_runs
    from reports.options import parse_goodput, parse_percentiles

    labels = None if args.labels is None else [s.strip() for s in args.labels.split(",")]
    result = compare_runs(
        args.run_dirs, args.out, labels,
        percentiles=parse_percentiles(args.metric_percentiles),
        goodput=parse_goodput(args.goodput) if args.goodput else None,
        plots=not args.no_plots,
    )
    base = result["baseline"]
    print(f"Compared {len(result['runs'])} runs (baseline {base}):")
    for row in result["rows"]:
        if row["run"] != base and row["stat"] in ("median", "p99") and row["rel_diff"] is not None:
            print(f"  {row['key']:<22} {row['run']:<20} {100 * row['rel_diff']:+7.1f}%")
    print(f"Comparison: {args.out}/compare.md, {args.out}/compare.html, {args.out}/compare.json")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="rebuild a run directory's summary, plots and report from its files",
        description="Recompute summary.json (vllm bench serve keys), the plots and "
        "report.md/report.html of a run directory from its tables. Options not given keep "
        "the values the run was reported with.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.json, tables)")
    add_report_arguments(p)
    p.set_defaults(func=_report)

    c = sub.add_parser(
        "compare",
        help="compare two or more run directories (A/B, or simulated vs measured)",
        description="Overlaid latency CDFs and relative differences per metric and "
        "percentile against the first run; writes compare.md/.html/.json into --out.",
    )
    c.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (first = "
                   "baseline)")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--labels", default=None, help="comma-separated run labels (one per run)")
    c.add_argument("--metric-percentiles", default="50,90,99",
                   help="comma-separated percentiles to compare (default 50,90,99)")
    c.add_argument("--goodput", nargs="+", metavar="KEY:MS", default=None,
                   help="SLOs for goodput, as in vllm bench (e.g. ttft:500 tpot:50)")
    c.add_argument("--no-plots", action="store_true", help="skip the overlaid-CDF plot")
    c.set_defaults(func=_compare)
