"""The served request path's costs, fitted from a real server's stage records.

``twinserve validate`` drives the running server with calibration runs (closed loops at a few
concurrencies, seeds of their own) and joins them with the server's records
(``experiments.loadgen.run_dir``). Each stage of the path the simulator models then has its
measured samples, on one clock:

============================  ==============================================================
``request_overhead_s``,       API server: request received → validated, templated, tokenized
``tokenize_s_per_token``      and sent (``TOKENIZED − server arrival``), by prompt tokens
``ipc_latency_s``             API server sent → the EngineCore's input thread received it
``schedule_overhead_s``,      the busy loop: ``schedule()`` → the executor starts, by scheduled
``schedule_s_per_request``    requests; plus the per-output cost of the loop's post-step CPU
``update_overhead_s``         the busy loop after a step: ``update_from_output``, publishing
                              the outputs, taking inputs → the next ``schedule()`` (steps the
                              loop went on from without waiting)
``output_batch_overhead_s``,  step applied → its tokens reached the client (minus the IPC and
``detokenize_s_per_token``,   the network), by tokens and by requests' first outputs: decoded,
``first_output_overhead_s``   detokenized, queued and written as SSE by the API server
``network_latency_s``         client send → server arrival, and the handler's output → the
                              client's receipt: the shorter of the two medians, both ways;
                              what one direction takes beyond it goes to that side's stage
                              (``request_overhead_s`` or ``output_batch_overhead_s``): on one
                              host the way in is mostly the API server's event loop getting
                              to the new connection, the way out the SSE write
============================  ==============================================================

Linear stages are non-negative least-squares fits with relative weights (``sim.cost.nnls``);
latencies are medians (robust to the host's hiccups). The request's own costs — the front end,
the IPC and the network — come from the *quiet* calibration runs (concurrency ≤ 4): at higher
concurrency the API server's one event loop also processes every step's outputs, and a request
then waits in its socket and its loop, which is queueing (what the simulator's structure must
produce), not cost. The engine loop's and the output path's costs come from every run (they
depend on the batch). The idle wake-up cost comes from the profile's wake-up probe
(``sim.cost.fitted.IdleWakeup``), measured in the EngineCore process.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.cost.nnls import fit_nonnegative


@dataclass(frozen=True, slots=True)
class ServedRun:
    """One joined run: its tables and the server-only ones (``bench`` run directory)."""

    tables: Any  # reports.tables.RunTables
    served_requests: Any  # DataFrame: req_index, server_arrival_s, engine_received_s …
    served_steps: Any  # DataFrame: step_id, processed_s, delivered_s

    @staticmethod
    def load(run_dir: Path) -> ServedRun:
        import pandas as pd

        from reports.run_dir import load_run_dir

        _, tables = load_run_dir(run_dir)
        return ServedRun(tables, pd.read_parquet(run_dir / "served_requests.parquet"),
                         pd.read_parquet(run_dir / "served_steps.parquet"))


@dataclass(frozen=True, slots=True)
class LinearFit:
    """``intercept_s + slope_s · units`` and the samples it was fitted to."""

    intercept_s: float
    slope_s: float
    num_samples: int

    def __call__(self, units: float) -> float:
        return self.intercept_s + self.slope_s * units


def fit_linear(units: np.ndarray, seconds: np.ndarray) -> LinearFit:
    """NNLS of ``seconds ≈ a + b·units`` with relative weights (no samples: zero cost)."""
    ok = np.isfinite(units) & np.isfinite(seconds) & (seconds > 0)
    x, y = units[ok].astype(np.float64), seconds[ok].astype(np.float64)
    if len(y) == 0:
        return LinearFit(0.0, 0.0, 0)
    if len(np.unique(x)) < 2:
        return LinearFit(float(np.median(y)), 0.0, len(y))
    coef = fit_nonnegative(np.column_stack([np.ones_like(x), x]), y, 1.0 / y)
    return LinearFit(float(coef[0]), float(coef[1]), len(y))


def _median(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else 0.0


@dataclass(frozen=True, slots=True)
class OutputFit:
    """``intercept_s + per_token_s · tokens + per_first_s · first outputs`` of a step."""

    intercept_s: float
    per_token_s: float
    per_first_s: float
    num_samples: int


def fit_output(tokens: np.ndarray, firsts: np.ndarray, seconds: np.ndarray) -> OutputFit:
    ok = np.isfinite(tokens) & np.isfinite(firsts) & np.isfinite(seconds) & (seconds > 0)
    x = np.column_stack([np.ones(int(ok.sum())), tokens[ok], firsts[ok]]).astype(np.float64)
    y = seconds[ok].astype(np.float64)
    if len(y) < 3:
        return OutputFit(float(np.median(y)) if len(y) else 0.0, 0.0, 0.0, len(y))
    coef = fit_nonnegative(x, y, 1.0 / y)
    return OutputFit(float(coef[0]), float(coef[1]), float(coef[2]), len(y))


@dataclass(frozen=True, slots=True)
class ServedPathCosts:
    """The fitted stages (see the module docstring) and what they map to in the simulator."""

    frontend: LinearFit  # seconds per request by prompt tokens
    ipc_in_s: float
    schedule: LinearFit  # by scheduled requests
    post: LinearFit  # by output tokens of the step
    output: OutputFit  # step applied -> at the client, by tokens and first outputs
    network_in_s: float
    network_out_s: float
    mean_output_len: float
    num_api_servers: int = 1

    def frontend_config_values(self, idle_wakeup_s: float = 0.0,
                               idle_wakeup_ramp_s: float = 0.0) -> dict[str, float | int]:
        """``sim.config.FrontendConfig`` fields that reproduce the served path."""
        network = max(min(self.network_in_s, self.network_out_s), 0.0)
        return {
            "num_api_servers": self.num_api_servers,
            "request_overhead_s": self.frontend.intercept_s + self.network_in_s - network,
            "tokenize_s_per_token": self.frontend.slope_s,
            "ipc_latency_s": self.ipc_in_s,
            "detokenize_s_per_token": self.output.per_token_s,
            "output_batch_overhead_s": max(self.output.intercept_s - self.ipc_in_s - network,
                                           0.0),
            "first_output_overhead_s": self.output.per_first_s,
            "network_latency_s": network,
            "schedule_overhead_s": self.schedule.intercept_s,
            # the loop's per-output CPU after a step, carried by the requests that produce them
            "schedule_s_per_request": self.schedule.slope_s + self.post.slope_s,
            "update_overhead_s": self.post.intercept_s,
            "idle_wakeup_s": idle_wakeup_s,
            "idle_wakeup_ramp_s": idle_wakeup_ramp_s,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: Path, **frontend: float) -> Path:
        path.write_text(json.dumps({"stages": self.to_json(),
                                    "frontend_config": self.frontend_config_values(**frontend)},
                                   indent=1) + "\n")
        return path


def request_frontend_s(run: ServedRun) -> np.ndarray:
    """Per request (req_index order): the API server's time from the request's arrival to its
    hand-off to the engine (NaN where the server never saw it)."""
    req = run.tables.requests
    arrival = np.full(len(req), np.nan)
    srv = run.served_requests
    arrival[srv["req_index"].to_numpy()] = srv["server_arrival_s"].to_numpy()
    return np.asarray(req["tokenized_s"].to_numpy(dtype=np.float64) - arrival)


#: The highest calibration concurrency whose runs give the request's own costs.
QUIET_CONCURRENCY = 4


def fit_served_path(runs: Sequence[tuple[int, ServedRun]]) -> ServedPathCosts:
    """Fit every stage over the calibration runs, given with their concurrency (see the
    module docstring; without a quiet run the quietest one gives the request's costs)."""
    if not runs:
        raise ValueError("fitting the served path needs calibration runs")
    quiet_limit = max(QUIET_CONCURRENCY, min(c for c, _ in runs))
    units: dict[str, list[np.ndarray]] = {k: [] for k in (
        "fe_x", "fe_y", "ipc", "sch_x", "sch_y", "post_x", "post_y", "out_x", "out_f",
        "out_y", "net_in", "net_out", "out_len")}
    for concurrency, run in runs:
        _collect(run, units, quiet=concurrency <= quiet_limit)
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in units.items()}
    out_len = cat["out_len"]
    return ServedPathCosts(
        frontend=fit_linear(cat["fe_x"], cat["fe_y"]),
        ipc_in_s=_median(cat["ipc"]),
        schedule=fit_linear(cat["sch_x"], cat["sch_y"]),
        post=fit_linear(cat["post_x"], cat["post_y"]),
        output=fit_output(cat["out_x"], cat["out_f"], cat["out_y"]),
        network_in_s=_median(cat["net_in"]),
        network_out_s=_median(cat["net_out"]),
        mean_output_len=float(out_len.mean()) if len(out_len) else math.nan,
    )


def _collect(run: ServedRun, into: dict[str, list[np.ndarray]], *, quiet: bool) -> None:
    req = run.tables.requests
    srv = run.served_requests.set_index("req_index").reindex(req["req_index"])
    ok = req["success"].to_numpy(dtype=bool)
    into["out_len"].append(req["num_output_tokens"].to_numpy(dtype=np.float64)[ok])
    if quiet:
        into["fe_x"].append(req["num_prompt_tokens"].to_numpy(dtype=np.float64)[ok])
        into["fe_y"].append(request_frontend_s(run)[ok])
        into["ipc"].append((srv["engine_received_s"].to_numpy()
                            - req["tokenized_s"].to_numpy())[ok])
        into["net_in"].append((srv["server_arrival_s"].to_numpy()
                               - req["arrival_s"].to_numpy())[ok])
    st = run.tables.steps.sort_values("step_id")
    st = st[st["num_tokens"] > 0]
    into["sch_x"].append(st["num_reqs"].to_numpy(dtype=np.float64))
    into["sch_y"].append((st["execute_start_s"] - st["schedule_time_s"]).to_numpy())
    # post-step CPU: steps the loop went on from at once (it still had work after them)
    nxt = st["schedule_time_s"].shift(-1).to_numpy()
    busy = (st["num_running"] + st["num_waiting"]).to_numpy() > 0
    gap = nxt - st["update_time_s"].to_numpy()
    into["post_x"].append(st["num_sampled_tokens"].to_numpy(dtype=np.float64)[busy])
    into["post_y"].append(gap[busy])
    handler = run.served_steps.groupby("step_id")["processed_s"].max()
    outs = st[st["num_sampled_tokens"] > 0].set_index("step_id")
    done = handler.reindex(outs.index).to_numpy()
    first_steps = run.tables.token_runs.groupby("req_index")["first_step"].min()
    firsts = first_steps.value_counts().reindex(outs.index, fill_value=0)
    into["out_x"].append(outs["num_sampled_tokens"].to_numpy(dtype=np.float64))
    into["out_f"].append(firsts.to_numpy(dtype=np.float64))
    into["out_y"].append(outs["delivered_time_s"].to_numpy() - outs["update_time_s"].to_numpy())
    if quiet:
        into["net_out"].append(outs["delivered_time_s"].to_numpy() - done)
