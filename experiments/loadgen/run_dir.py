"""A benchmark's twinserve run directory: what ``twinserve report`` and ``compare`` read.

``BenchRecord`` is everything the client measured, saved as ``bench_client.json`` in the run
directory (so the join with the server's records can be made again later: ``twinserve bench
join``). ``write_bench_run_dir`` writes the directory: the event log of
``experiments.loadgen.run_log`` (the client alone, or joined with a ``twinserve serve
--record-dir`` run's records), the usual tables, summary and report, and beside them

* ``client_requests`` — per request: its id, send time, TTFT, latency, tokens, chunks, client
  queue time, error (time 0 = the first send);
* with the server's records, ``served_requests`` and ``served_steps``
  (``experiments.serve.run_dir.served_tables``) for this run's requests and steps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.events import EventKind
from experiments.loadgen.client import RequestOutput
from experiments.loadgen.inputs import BenchRequest
from experiments.loadgen.run_log import (
    Alignment,
    ClientRequest,
    align,
    client_log,
    joined_log,
    tokens_per_chunk,
)

CLIENT_FILE = "bench_client.json"
FORMAT = "twinserve-bench-client/1"


@dataclass(frozen=True, slots=True)
class BenchRecord:
    """A finished benchmark as the client saw it (``bench_client.json``)."""

    requests: list[BenchRequest]
    outputs: list[RequestOutput]
    start_s: float  # clock() at the benchmark's start
    end_s: float
    meta: dict[str, Any]  # the run's description (config.json of the run directory)

    def client_requests(self) -> list[ClientRequest]:
        return [ClientRequest(r, o, tokens_per_chunk(o, o.chunk_completion_tokens or None))
                for r, o in zip(self.requests, self.outputs, strict=True)]

    def save(self, path: Path) -> Path:
        values = {"format": FORMAT, "start_s": self.start_s, "end_s": self.end_s,
                  "meta": self.meta,
                  # the prompts are left out (token ids of long runs would be most of the file)
                  "requests": [{**asdict(r), "prompt": ""} for r in self.requests],
                  "outputs": [asdict(o) for o in self.outputs]}
        path.write_text(json.dumps(values) + "\n")
        return path

    @staticmethod
    def load(path: Path) -> BenchRecord:
        try:
            values = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read the benchmark's client record {path}: {exc}") from None
        if not isinstance(values, dict) or values.get("format") != FORMAT:
            raise UserError(f"{path} is not a twinserve bench client record")
        return BenchRecord([BenchRequest(**r) for r in values["requests"]],
                           [RequestOutput(**o) for o in values["outputs"]],
                           values["start_s"], values["end_s"],
                           values["meta"])


@dataclass(frozen=True, slots=True)
class JoinedServer:
    """What a server's records add to a benchmark's run directory."""

    log: dict[str, Any]  # the joined export
    served_requests: Any  # DataFrame
    served_steps: Any  # DataFrame
    alignment: Alignment
    num_api_servers: int
    engine_device: str
    engine_config: dict[str, Any]  # scheduler/cache as the records know them


@dataclass(frozen=True, slots=True)
class ServerRecords:
    """A stopped server's records, read once and joined into one log."""

    records: Any  # experiments.serve.run_dir.ServedRecords
    joined: dict[str, Any]  # the whole server's log (its clock, 0 = first arrival)
    internal: dict[str, str]  # the client's request id -> the server's
    arrivals: dict[str, float]  # the server's request id -> when the request arrived
    log_origin_s: float  # the joined log's time 0 on the run clock

    @staticmethod
    def read(record_dir: Path) -> ServerRecords:
        """A ``twinserve serve --record-dir`` directory (or its ``records/``); every process
        must have shut down, which writes them."""
        from experiments.serve.run_dir import external_ids, joined_log, read_records

        records_dir = record_dir / "records" if (record_dir / "records").is_dir() else record_dir
        count = len(list(records_dir.glob("api-server-*.pkl")))
        if count == 0:
            raise UserError(f"{records_dir} holds no API server records: start the server "
                            "with --record-dir DIR and stop it before joining")
        records = read_records(records_dir, count)
        joined = joined_log(records)
        ev = joined["events"]
        arrivals = {joined["req_ids"][r]: float(t) for r, k, t in zip(
            ev["req_index"], ev["kind"], ev["time_s"], strict=True) if k == EventKind.ARRIVAL}
        origin = min((t for rec in records.api_servers
                      for k, t in zip(rec.kinds, rec.times_s, strict=True)
                      if k == EventKind.ARRIVAL), default=0.0)
        internal = {ext: rid for rid, ext in external_ids(records).items()}
        return ServerRecords(records, joined, internal, arrivals, origin)


def join_server_records(record: BenchRecord, server: Path | ServerRecords) -> JoinedServer:
    """Join the client's requests with a server's records (a directory, or read already)."""
    s = server if isinstance(server, ServerRecords) else ServerRecords.read(server)
    clients = record.client_requests()
    if not any(c.request.request_id in s.internal for c in clients):
        raise UserError("none of this benchmark's requests is in the server's records: they "
                        "hold other requests")
    alignment = align(clients, s.internal, s.arrivals,
                      s.records.api_servers[0].clock_origin_s, s.log_origin_s)
    log = joined_log(clients, s.joined, s.internal, alignment)
    requests, steps = _served_tables(s, clients, log, alignment)
    engine = s.records.engine
    return JoinedServer(log, requests, steps, alignment, len(s.records.api_servers),
                        engine.device,
                        {"scheduler": {"max_model_len": engine.max_model_len},
                         "cache": {"num_gpu_blocks": engine.num_gpu_blocks}})


def _served_tables(s: ServerRecords, clients: Sequence[ClientRequest], log: dict[str, Any],
                   alignment: Alignment) -> tuple[Any, Any]:
    """``served_tables`` of the server, cut to this run and put on its timeline, with each
    request's arrival at the server (``server_arrival_s``: the client's send is the run
    directory's arrival)."""
    from experiments.serve.run_dir import served_tables

    requests, steps = served_tables(s.records, s.joined)
    t0 = min(c.output.start_time for c in clients)
    shift = alignment.offset_s - t0
    index = {s.internal[c.request.request_id]: i for i, c in enumerate(clients)
             if c.request.request_id in s.internal}
    requests = requests[requests["req_id"].isin(list(index))].copy()
    requests["server_arrival_s"] = requests["req_id"].map(s.arrivals) + shift
    requests["req_index"] = requests["req_id"].map(index)
    requests["req_id"] = requests["req_index"].map(lambda i: clients[i].request.request_id)
    requests["engine_received_s"] = requests["engine_received_s"] + shift
    requests = requests.sort_values("req_index", ignore_index=True)
    steps = steps[steps["step_id"].isin(list(log["steps"]["step_id"]))].copy()
    for col in ("processed_s", "delivered_s"):
        steps[col] = steps[col] + shift
    return requests, steps.reset_index(drop=True)


def client_table(record: BenchRecord) -> Any:
    """``client_requests``: the client's own view of each request (seconds, 0 = first send)."""
    import pandas as pd

    t0 = min(o.start_time for o in record.outputs)
    rows = [{
        "req_index": i, "request_id": r.request_id, "success": o.success,
        "send_s": o.start_time - t0, "client_queue_s": o.client_queue_time,
        "ttft_s": o.ttft if o.success else float("nan"),
        "latency_s": o.latency if o.success else float("nan"),
        "prompt_tokens": o.prompt_len, "output_tokens": o.output_tokens,
        "num_chunks": len(o.chunk_times), "finish_reason": o.finish_reason,
        "error": o.error or None,
    } for i, (r, o) in enumerate(zip(record.requests, record.outputs, strict=True))]
    return pd.DataFrame(rows)


def write_bench_run_dir(out_dir: Path, record: BenchRecord, *, server: JoinedServer | None,
                        options: Any, plots: bool, file_format: str,
                        engine_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run directory of ``record`` (joined with ``server`` when given); its summary.
    ``engine_config`` is the served engine's whole config when the caller knows it (the
    records know only its KV blocks and max_model_len)."""
    from reports.errors import ReportError
    from reports.run_dir import open_run_dir, write_run_files
    from reports.tables import ExportedLog, build_tables
    from reports.written import commit_run

    meta = dict(record.meta)
    if server is not None:
        log = server.log
        meta["num_api_servers"] = server.num_api_servers
        meta["device"] = server.engine_device
        meta["engine_config"] = engine_config or server.engine_config
        meta["steps"] = "engine"
        meta["clock_alignment"] = server.alignment.source
    else:
        log = client_log(record.client_requests())
        meta["steps"] = "client chunks (one step per output token, at its chunk's arrival)"
    with open_run_dir(out_dir) as out:  # written whole, like every run directory
        try:
            written = write_run_files(
                out.staging, build_tables(ExportedLog(log)), meta, goodput=options.goodput,
                percentiles=options.percentiles, percentile_metrics=options.percentile_metrics,
                plots=plots, file_format=file_format,  # type: ignore[arg-type]
            )
        except ReportError as exc:
            raise UserError(str(exc)) from None
        tables = {"client_requests": client_table(record)}
        if server is not None:
            tables["served_requests"] = server.served_requests
            tables["served_steps"] = server.served_steps
        for name, table in tables.items():
            if file_format == "parquet":
                table.to_parquet(out.staging / f"{name}.parquet", index=False)
            else:
                table.to_csv(out.staging / f"{name}.csv", index=False)
        record.save(out.staging / CLIENT_FILE)
        commit_run(out, written)
    return written.summary
