"""``twinserve bench serve``: a load generator with ``vllm bench serve``'s flags, table and result
JSON, fed by the workload definitions ``twinserve simulate`` uses; ``twinserve bench join``:
join a benchmark's run directory with the records of the server it measured.

``bench serve`` prints vllm's "Serving Benchmark Result" table, writes vllm's result JSON with
``--save-result`` (``--result-dir``, ``--result-filename``, ``--save-detailed``,
``--append-result``, ``--metadata``), and always a twinserve run directory (``--out``, default
``runs/bench-<timestamp>``) that ``twinserve report`` and ``twinserve compare`` read. With
``--server-record-dir DIR`` (the ``--record-dir`` of a ``twinserve serve`` that has stopped) the
run directory joins the client's times with the server's stage records; ``bench join`` does
that later, once the server has stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from experiments.cli.flags import add_report_flags, add_workload_flags, default_out_dir


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        if "=" not in item:
            raise UserError(f"{flag} takes KEY=VALUE pairs, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def _extra_body(args: argparse.Namespace) -> dict[str, Any]:
    sampling = {k: getattr(args, k) for k in ("top_p", "top_k", "min_p", "temperature",
                                              "frequency_penalty", "presence_penalty",
                                              "repetition_penalty")
                if getattr(args, k) is not None}
    extra: dict[str, Any] = {}
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as exc:
            raise UserError(f"--extra-body is not valid JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise UserError("--extra-body must be a JSON object")
    return {**sampling, **extra}


def _workload_config(args: argparse.Namespace) -> Any:
    from experiments.simconfig import workload_dict_from_args
    from workload.config import WorkloadConfig

    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        args.random_output_len = args.output_len
        args.sharegpt_output_len = args.output_len
        args.prefix_repetition_output_len = args.output_len
    return WorkloadConfig(**workload_dict_from_args(args))


def _base_url(args: argparse.Namespace) -> str:
    if args.base_url:
        return str(args.base_url).rstrip("/")
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"http://{host}:{args.port}"


def _result_path(args: argparse.Namespace, model_id: str, label: str | None,
                 date: str) -> Path:
    """vllm bench's result file name: ``--result-filename`` or
    ``{label}-{rate}qps[-concurrency{C}]-{model}-{date}.json``, under ``--result-dir``."""
    concurrency = (f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None
                   else "")
    label = label or args.backend
    base = model_id.split("/")[-1]
    if args.ramp_up_strategy is not None:
        name = (f"{label}-ramp-up-{args.ramp_up_strategy}-{args.ramp_up_start_rps}qps-"
                f"{args.ramp_up_end_rps}qps{concurrency}-{base}-{date}.json")
    else:
        rate = args.request_rate if args.request_rate is not None else float("inf")
        name = f"{label}-{rate}qps{concurrency}-{base}-{date}.json"
    if args.result_filename:
        name = args.result_filename
    if args.result_dir:
        Path(args.result_dir).mkdir(parents=True, exist_ok=True)
        return Path(args.result_dir) / name
    return Path(name)


def _percentile_metrics(args: argparse.Namespace) -> list[str]:
    """vllm bench's --percentile-metrics (the client-queue metrics too); the run directory's
    summary keeps the four it computes (``args.percentile_metrics`` is narrowed to them)."""
    from experiments.loadgen.result import METRICS

    names = [m.strip() for m in str(args.percentile_metrics).split(",") if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if unknown or not names:
        raise UserError(f"invalid percentile metric {unknown[0] if unknown else '(none)'!r}: "
                        f"valid names are {', '.join(METRICS)}")
    kept = [m for m in names if m in ("ttft", "tpot", "itl", "e2el")]
    args.percentile_metrics = ",".join(kept or ["ttft", "tpot", "itl"])
    return names


def _bench_serve(args: argparse.Namespace) -> int:
    from experiments.cli.reporting import prepare_out_dir, report_options
    from experiments.loadgen.bench import (
        BenchOptions,
        describe_traffic,
        print_failures,
        run_bench,
    )
    from experiments.loadgen.result import ResultHeader, benchmark_result, format_result

    bench_metrics = _percentile_metrics(args)
    options = report_options(args)
    headers = _pairs(args.header, "--header")
    metadata = _pairs(args.metadata, "--metadata")
    # as vllm bench: the tokenizer is --tokenizer, else the model's (here: a local directory)
    tokenizer = args.tokenizer or (args.model if args.model and Path(args.model).is_dir()
                                   else None)
    args.tokenizer = tokenizer
    workload_cfg = _workload_config(args)
    out_dir = prepare_out_dir(Path(args.out) if args.out else default_out_dir("bench"))
    bench = BenchOptions(
        base_url=_base_url(args), endpoint=args.endpoint, backend=args.backend,
        model=args.served_model_name or args.model, tokenizer=tokenizer, label=args.label,
        request_id_prefix=args.request_id_prefix, ignore_eos=True if args.ignore_eos else None,
        logprobs=args.logprobs, extra_body=_extra_body(args), headers=headers,
        num_warmups=args.num_warmups, token_seed=args.token_seed,
        continuous_usage=args.continuous_usage_stats, insecure=args.insecure,
        progress=not args.disable_tqdm,
    )
    describe_traffic(workload_cfg, workload_cfg.max_concurrency)
    record = run_bench(bench, workload_cfg)
    print_failures(record)
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    ramp = None
    if workload_cfg.ramp_up_strategy is not None:
        # vllm's flags are integers: whole rates are written as such
        start, end = (int(r) if float(r).is_integer() else r for r in (
            workload_cfg.ramp_up_start_rps, workload_cfg.ramp_up_end_rps))
        ramp = (workload_cfg.ramp_up_strategy, start, end)
    model_id = args.model or str(record.meta["model_id"])
    header = ResultHeader(
        date=date, backend=args.backend, label=args.label, model_id=model_id,
        tokenizer_id=tokenizer or model_id, num_prompts=workload_cfg.num_prompts,
        request_rate=workload_cfg.request_rate, burstiness=workload_cfg.burstiness,
        max_concurrency=workload_cfg.max_concurrency, metadata=metadata, ramp_up=ramp)
    result = benchmark_result(
        header, record.outputs, record.end_s - record.start_s,
        percentile_metrics=bench_metrics, percentiles=options.percentiles,
        goodput=options.goodput or {}, detailed=args.save_detailed,
        rps_change_events=_rps_change_events(workload_cfg, record))
    print(format_result(result))
    if args.save_result or args.append_result:
        path = _result_path(args, model_id, args.label, date)
        with path.open("a+" if args.append_result else "w", encoding="utf-8") as f:
            if args.append_result and f.tell() != 0:
                f.write("\n")
            json.dump(_plain(result), f)
        print(f"result: {path}", file=sys.stderr)
    _write_run_dir(out_dir, record, args, options)
    return 0


def _rps_change_events(workload_cfg: Any, record: Any) -> list[dict[str, Any]]:
    """vllm bench's ``rps_change_events`` of a ramp-up: each whole request rate reached, with
    the wall-clock time (ISO) its first request at that rate was sent."""
    if workload_cfg.ramp_up_strategy is None:
        return []
    import time

    from experiments.loadgen.connection import clock
    from workload.arrivals import ramp_up_rates

    to_wall = time.time() - clock()
    rates = ramp_up_rates(len(record.requests), workload_cfg.ramp_up_strategy,
                          workload_cfg.ramp_up_start_rps, workload_cfg.ramp_up_end_rps)
    last = int(workload_cfg.ramp_up_start_rps)
    events = [{"rps": last, "timestamp": datetime.fromtimestamp(
        record.start_s + to_wall).isoformat()}]
    for rate, request in zip(rates, record.requests, strict=True):
        if int(rate) > last:
            stamp = datetime.fromtimestamp(record.start_s + request.send_time_s
                                           + to_wall).isoformat()
            events += [{"rps": r, "timestamp": stamp} for r in range(last + 1, int(rate) + 1)]
            last = int(rate)
    return events


def _plain(value: Any) -> Any:
    """vllm writes its result with json.dump: NaN and infinities as JSON's NaN/Infinity."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


def _write_run_dir(out_dir: Path, record: Any, args: argparse.Namespace, options: Any) -> None:
    from experiments.loadgen.run_dir import join_server_records, write_bench_run_dir

    server = None
    if args.server_record_dir:
        server = join_server_records(record, Path(args.server_record_dir))
    write_bench_run_dir(out_dir, record, server=server, options=options,
                        plots=not args.no_plots, file_format=args.format)
    print(f"\nRun directory: {out_dir}", file=sys.stderr)


def _bench_join(args: argparse.Namespace) -> int:
    from experiments.cli.reporting import report_options
    from experiments.loadgen.run_dir import (
        CLIENT_FILE,
        BenchRecord,
        join_server_records,
        write_bench_run_dir,
    )

    options = report_options(args)
    run_dir = Path(args.run_dir)
    record = BenchRecord.load(run_dir / CLIENT_FILE)
    server = join_server_records(record, Path(args.server_record_dir))
    summary = write_bench_run_dir(run_dir, record, server=server, options=options,
                                  plots=not args.no_plots, file_format=args.format)
    print(f"joined {summary['completed']} completed requests with the server's records "
          f"(clocks: {server.alignment.source}); run directory: {run_dir}", file=sys.stderr)
    return 0


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    """vllm bench serve's client flags (its names and defaults)."""
    g = p.add_argument_group("server and requests (vllm bench serve's names)")
    g.add_argument("--backend", default="openai", choices=["openai", "vllm", "openai-chat"])
    g.add_argument("--base-url", help="server or API base URL (else http://HOST:PORT)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--endpoint", default="/v1/completions", help="API endpoint")
    g.add_argument("--header", nargs="*", metavar="KEY=VALUE",
                   help="headers sent with every request")
    g.add_argument("--model", help="model name (default: the first of the server's "
                   "/v1/models); a local directory also gives the tokenizer")
    g.add_argument("--served-model-name", help="the name sent in requests (default --model)")
    g.add_argument("--input-len", type=int, help="maps to --random-input-len")
    g.add_argument("--output-len", type=int, help="maps to the dataset's output length")
    g.add_argument("--label", help="the result's label (default: --backend)")
    g.add_argument("--logprobs", type=int)
    g.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (on anyway for random, prefix_repetition and trace: "
                   "requests then end at the workload's output lengths, as simulated ones do)")
    g.add_argument("--num-warmups", type=int, default=0)
    g.add_argument("--request-id-prefix", default="bench-",
                   help="request i is sent with X-Request-Id PREFIXi")
    g.add_argument("--extra-body", help="JSON object merged into every request body")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress line")
    g.add_argument("--insecure", action="store_true", help="skip TLS certificate checks")
    g.add_argument("--token-seed", type=int,
                   help="seed of the synthetic prompt tokens (default: --seed); the lengths "
                   "and arrivals stay the workload's")
    g.add_argument("--continuous-usage-stats", action="store_true",
                   help="ask for usage on every chunk (exact tokens per chunk in the run "
                   "directory; not in vllm bench's payload)")
    s = p.add_argument_group("sampling parameters")
    for name, kind in (("top-p", float), ("top-k", int), ("min-p", float),
                       ("temperature", float), ("frequency-penalty", float),
                       ("presence-penalty", float), ("repetition-penalty", float)):
        s.add_argument(f"--{name}", type=kind)
    r = p.add_argument_group("vllm's result JSON")
    r.add_argument("--save-result", action="store_true")
    r.add_argument("--save-detailed", action="store_true",
                   help="keep the per-request arrays in the result JSON")
    r.add_argument("--append-result", action="store_true")
    r.add_argument("--metadata", nargs="*", metavar="KEY=VALUE")
    r.add_argument("--result-dir")
    r.add_argument("--result-filename")


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks of a running server (bench serve, bench join)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bench = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH_COMMAND")
    s = bench.add_parser("serve", help="a vllm-bench-serve-compatible load generator",
                         description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_client_flags(s)
    add_workload_flags(s)
    add_report_flags(s, "bench")
    s.add_argument("--server-record-dir",
                   help="the --record-dir of the (stopped) twinserve serve that was measured: "
                   "join its stage records into the run directory")
    s.set_defaults(func=_bench_serve, dataset_name=None)
    j = bench.add_parser("join", help="join a bench run directory with the server's records",
                         description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    j.add_argument("run_dir", help="the run directory bench serve wrote")
    j.add_argument("--server-record-dir", required=True,
                   help="the --record-dir of the twinserve serve that was measured")
    j.add_argument("--no-plots", action="store_true")
    j.add_argument("--goodput", nargs="+", metavar="KEY:MS")
    j.add_argument("--metric-percentiles", default="99")
    j.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    j.add_argument("--format", choices=["parquet", "csv"], default="parquet")
    j.set_defaults(func=_bench_join)
