"""The hardware catalog's links between GPUs: NVLink inside a node, the network between nodes.

A simulated layout places a replica's ranks on nodes of ``gpus_per_node`` GPUs in vLLM's rank
order (TP ranks of a stage are neighbours): tensor parallelism stays inside a node, over NVLink;
a pipeline hop or a data-parallel replica that does not fit in the node crosses the network.
``stage_links`` says, for each hop between consecutive stages, which link it takes.

Bandwidths are per GPU and one direction: each GPU of an HGX node has its own NIC (rail
design), so the network bandwidth of a TP rank's slice is the NIC's line rate. Latencies are
those of one small NCCL point-to-point send/recv as published NCCL-tests runs show them
(estimates, not fitted: a few µs inside a node, ~10-20 µs through InfiniBand or RoCE switches).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.config import ConfigError
from sim.cost.pipeline import Link
from sim.hardware import GPUSpec

#: One small NCCL send/recv between two GPUs of one node over NVLink (estimate).
NVLINK_P2P_LATENCY_S = 6e-6
#: GPUs per node unless the layout says otherwise (HGX/DGX H100, H200, A100).
DEFAULT_GPUS_PER_NODE = 8


class UnknownNetworkError(ConfigError):
    """An unknown network name; the message lists the catalog."""


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    """The fabric between nodes, per GPU."""

    name: str  # catalog key
    display_name: str
    bandwidth_gbps: float  # line rate per GPU (its NIC), Gb/s, one direction
    latency_s: float  # one small NCCL send/recv between nodes

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8


NETWORKS: dict[str, NetworkSpec] = {
    n.name: n
    for n in (
        NetworkSpec("infiniband-ndr", "InfiniBand NDR 400 Gb/s per GPU (ConnectX-7)", 400.0,
                    12e-6),
        NetworkSpec("infiniband-hdr", "InfiniBand HDR 200 Gb/s per GPU (ConnectX-6)", 200.0,
                    14e-6),
        NetworkSpec("roce-400", "RoCE v2 400 GbE per GPU", 400.0, 18e-6),
        NetworkSpec("ethernet-100", "100 GbE per node shared by 8 GPUs (TCP sockets)", 12.5,
                    60e-6),
    )
}
DEFAULT_NETWORK = "infiniband-ndr"


def get_network(name: str) -> NetworkSpec:
    key = name.strip().lower()
    if key not in NETWORKS:
        raise UnknownNetworkError(f"unknown network {name!r}; valid: {', '.join(NETWORKS)}")
    return NETWORKS[key]


def nvlink(gpu: GPUSpec) -> Link:
    return Link(gpu.link_bw_bytes_s, NVLINK_P2P_LATENCY_S, "nvlink")


def stage_links(gpu: GPUSpec, network: NetworkSpec, tensor_parallel_size: int,
                pipeline_parallel_size: int, gpus_per_node: int) -> tuple[Link, ...]:
    """The link of each hop from stage ``s`` to ``s + 1``: the network when the two stages'
    ranks sit on different nodes, NVLink otherwise."""
    tp = tensor_parallel_size
    if tp > gpus_per_node:
        raise ConfigError(
            f"tensor_parallel_size {tp} exceeds the {gpus_per_node} GPUs of a node: the "
            "simulator keeps tensor parallelism inside a node (over NVLink)"
        )
    inter = Link(network.bandwidth_bytes_s, network.latency_s, network.name)
    links = []
    for s in range(pipeline_parallel_size - 1):
        crosses = (s * tp) // gpus_per_node != ((s + 1) * tp) // gpus_per_node
        links.append(inter if crosses else nvlink(gpu))
    return tuple(links)
