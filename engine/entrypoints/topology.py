"""The process topology of ``twinserve serve``: which processes a layout starts, their roles,
ranks and devices, and the links between them (``twinserve topology`` prints it; the launcher
and the executors start exactly these processes).

vLLM V1's layout, for TP × PP × DP with N API servers (N defaults to the DP degree):

* N **API servers** (``APIServer_i``), each connected over ZeroMQ to every EngineCore;
* DP **EngineCores** (``EngineCore_DPd``), each running the scheduler and driving its own
  TP × PP **workers** (``Worker_TPt``, or ``Worker_PPp_TPt`` with PP > 1), one process and one
  device per rank, started by that EngineCore's multiprocess executor;
* with DP > 1, one **DP coordinator** (``DPCoordinator``) that collects every EngineCore's load
  and publishes it to the API servers, whose routers use it.

A replica of world size 1 runs its model inside the EngineCore process (vLLM's uniprocess
executor), unless the multiprocess executor is asked for. The launcher itself (the ``twinserve
serve`` process) is the root of the tree and is not counted: TP=4 is 1 + 1 + 4 = 6 processes,
TP=2 × DP=4 is 4 + 4 + 8 + 1 = 17.

Devices: rank ``r`` of replica ``d`` uses device ``d × world_size + r`` (``cuda:i``, or
``nodeK/cuda:i`` when the layout spans nodes of ``devices_per_node`` devices); on CPU every
rank uses the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.core.config import ConfigError
from engine.core.parallel import ParallelConfig
from engine.core.parallel import worker_process_name as worker_name

DeviceKind = Literal["cuda", "cpu"]
ExecutorBackend = Literal["uni", "mp"]

#: Roles, in the order processes are listed.
API_SERVER = "API server"
DP_COORDINATOR = "DP coordinator"
ENGINE_CORE = "EngineCore"
WORKER = "worker"
LAUNCHER = "launcher"


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One process of a deployment."""

    name: str  # its process name (set as the Linux process name, /proc/PID/comm)
    role: str  # API_SERVER, DP_COORDINATOR, ENGINE_CORE or WORKER
    parent: str  # the process that starts it (LAUNCHER or an EngineCore's name)
    ranks: str  # its ranks in words
    device: str  # the device it computes on ("-" for processes without a model)
    dp_rank: int | None = None  # engine replica (EngineCores and workers)
    pp_rank: int | None = None  # pipeline stage (workers)
    tp_rank: int | None = None  # tensor rank (workers)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A channel between processes."""

    transport: str  # "ZeroMQ" or "torch.distributed (gloo|nccl)"
    ends: str  # which processes it connects
    carries: str  # what goes over it


@dataclass(frozen=True, slots=True)
class Topology:
    """Everything ``twinserve topology`` prints."""

    parallel: ParallelConfig
    api_server_count: int
    device_kind: DeviceKind
    executor_backend: ExecutorBackend
    processes: tuple[ProcessSpec, ...]
    links: tuple[LinkSpec, ...]

    def by_role(self, role: str) -> list[ProcessSpec]:
        return [p for p in self.processes if p.role == role]


def engine_name(dp_rank: int) -> str:
    return f"EngineCore_DP{dp_rank}"


def api_server_name(index: int) -> str:
    return f"APIServer_{index}"


def default_executor_backend(parallel: ParallelConfig) -> ExecutorBackend:
    """vLLM's choice: the model in the EngineCore process for one rank, worker processes else."""
    return "mp" if parallel.world_size > 1 else "uni"


def device_name(kind: DeviceKind, index: int, devices_per_node: int, num_devices: int) -> str:
    if kind == "cpu":
        return "cpu"
    if num_devices <= devices_per_node:
        return f"cuda:{index}"
    return f"node{index // devices_per_node}/cuda:{index % devices_per_node}"


def plan_topology(
    parallel: ParallelConfig,
    *,
    api_server_count: int | None = None,
    device_kind: DeviceKind = "cuda",
    executor_backend: ExecutorBackend | None = None,
    devices_per_node: int = 8,
) -> Topology:
    """The processes and links of ``parallel`` behind ``api_server_count`` API servers."""
    n_api = parallel.data_parallel_size if api_server_count is None else api_server_count
    if n_api < 1:
        raise ConfigError(f"api_server_count must be >= 1, got {n_api}")
    if devices_per_node < 1:
        raise ConfigError(f"devices_per_node must be >= 1, got {devices_per_node}")
    backend = executor_backend or default_executor_backend(parallel)
    if backend == "uni" and parallel.world_size > 1:
        raise ConfigError(
            f"the uniprocess executor runs one rank; TP × PP = {parallel.world_size} needs the "
            "multiprocess executor (mp)"
        )
    dp, world = parallel.data_parallel_size, parallel.world_size
    procs = [
        ProcessSpec(api_server_name(i), API_SERVER, LAUNCHER, f"client {i}", "-")
        for i in range(n_api)
    ]
    if dp > 1:
        procs.append(ProcessSpec("DPCoordinator", DP_COORDINATOR, LAUNCHER, "-", "-"))
    for d in range(dp):
        engine = engine_name(d)
        engine_device = "-"
        if backend == "uni":
            engine_device = device_name(device_kind, d, devices_per_node, parallel.num_devices)
        procs.append(ProcessSpec(engine, ENGINE_CORE, LAUNCHER, f"DP {d}", engine_device,
                                 dp_rank=d))
        if backend == "uni":
            continue
        for p in range(parallel.pipeline_parallel_size):
            for t in range(parallel.tensor_parallel_size):
                rank = parallel.rank(p, t)
                index = d * world + rank
                procs.append(ProcessSpec(
                    worker_name(parallel, p, t), WORKER, engine,
                    f"DP {d} PP {p} TP {t} (rank {rank} of {world})",
                    device_name(device_kind, index, devices_per_node, parallel.num_devices),
                    dp_rank=d, pp_rank=p, tp_rank=t,
                ))
    return Topology(parallel, n_api, device_kind, backend, tuple(procs),
                    _links(parallel, n_api, device_kind, backend))


def _links(parallel: ParallelConfig, n_api: int, kind: DeviceKind,
           backend: ExecutorBackend) -> tuple[LinkSpec, ...]:
    dp = parallel.data_parallel_size
    engines = "EngineCore_DP0" if dp == 1 else f"each of the {dp} EngineCores"
    apis = "APIServer_0" if n_api == 1 else f"each of the {n_api} API servers"
    links = [
        LinkSpec("ZeroMQ", f"{apis} → {engines}", "requests and aborts (ROUTER → DEALER)"),
        LinkSpec("ZeroMQ", f"{engines} → {apis}", "outputs (PUSH → PULL)"),
    ]
    if dp > 1:
        links += [
            LinkSpec("ZeroMQ", f"{engines} → DPCoordinator", "load reports (PUSH → PULL)"),
            LinkSpec("ZeroMQ", f"DPCoordinator → {apis}",
                     "load snapshots for the router (PUB → SUB)"),
        ]
    if backend == "mp":
        owner = "EngineCore" if dp == 1 else "each EngineCore"
        last = parallel.pipeline_parallel_size - 1
        output = worker_name(parallel, last, 0)
        links += [
            LinkSpec("ZeroMQ", f"{owner} → its {parallel.world_size} workers",
                     "each step's scheduler output, one copy per rank (PUSH → PULL)"),
            LinkSpec("ZeroMQ", f"{output} (the output rank) → {owner}",
                     "sampled tokens of each step (PUSH → PULL)"),
        ]
    if parallel.world_size > 1:
        backend_name = "nccl" if kind == "cuda" else "gloo"
        tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
        scope = "" if dp == 1 else " (one group per EngineCore)"
        if tp > 1:
            links.append(LinkSpec(
                f"torch.distributed ({backend_name})", f"{pp} TP group(s) of {tp} ranks{scope}",
                "all-reduce after each row-parallel layer, all-gather of the logits"))
        if pp > 1:
            links.append(LinkSpec(
                f"torch.distributed ({backend_name})",
                f"{tp} PP chain(s) of {pp} stages{scope}",
                "hidden states of each step, stage to stage (send → recv)"))
    return tuple(links)


def format_topology(topo: Topology) -> str:
    """The table ``twinserve topology`` prints."""
    par = topo.parallel
    lines = [
        f"TP {par.tensor_parallel_size} × PP {par.pipeline_parallel_size} × DP "
        f"{par.data_parallel_size} on {par.num_devices} {topo.device_kind} rank(s), "
        f"{topo.api_server_count} API server(s), {topo.executor_backend} executor: "
        f"{len(topo.processes)} processes under the launcher",
        "",
    ]
    rows = [("process", "role", "started by", "ranks", "device")]
    rows += [(p.name, p.role, p.parent, p.ranks, p.device) for p in topo.processes]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    lines += ["", "links:"]
    for link in topo.links:
        lines.append(f"  {link.transport}: {link.ends} — {link.carries}")
    lines += ["", "(the launcher also runs Python's multiprocessing resource tracker, as every "
              "process that spawns others does)"]
    return "\n".join(lines)
