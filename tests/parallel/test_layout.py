"""The parallel layout rules both worlds share, and the topology ``twinserve topology`` prints."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.core.config import ConfigError
from engine.core.parallel import (
    ParallelConfig,
    check_device_count,
    pp_layer_partition,
    pp_layer_range,
)
from engine.entrypoints.topology import (
    API_SERVER,
    DP_COORDINATOR,
    ENGINE_CORE,
    WORKER,
    plan_topology,
)


@pytest.mark.parametrize(
    ("layers", "pp", "parts"),
    [(32, 1, (32,)), (32, 4, (8, 8, 8, 8)), (10, 4, (2, 3, 3, 2)), (11, 4, (3, 3, 3, 2)),
     (5, 2, (3, 2)), (4, 4, (1, 1, 1, 1)), (80, 3, (27, 27, 26))],
)
def test_layers_split_as_vllms_get_pp_indices(layers: int, pp: int,
                                               parts: tuple[int, ...]) -> None:
    assert pp_layer_partition(layers, pp) == parts
    ranges = [pp_layer_range(layers, pp, r) for r in range(pp)]
    assert [len(r) for r in ranges] == list(parts)
    assert [i for r in ranges for i in r] == list(range(layers))


def test_bad_layouts_are_one_clear_error_each() -> None:
    with pytest.raises(ConfigError, match=r"tensor_parallel_size 3 does not divide .*'s 4 "
                       "attention heads"):
        ParallelConfig(tensor_parallel_size=3).check_model(4, 2, 2, "tiny")
    with pytest.raises(ConfigError, match=r"neither divides nor is a multiple of .* 6 KV heads"):
        ParallelConfig(tensor_parallel_size=4).check_model(12, 6, 2)
    with pytest.raises(ConfigError, match=r"pipeline_parallel_size 3 exceeds .* 2 decoder layers"):
        ParallelConfig(pipeline_parallel_size=3).check_model(4, 2, 2)
    with pytest.raises(ConfigError, match="data_parallel_size must be an integer"):
        ParallelConfig(data_parallel_size=0)
    ParallelConfig(tensor_parallel_size=8).check_model(32, 4, 2)  # KV heads replicated
    with pytest.raises(ConfigError, match=r"needs 8 GPUs \(one per rank: TP × PP × DP\) but "
                       r"this machine has 1"):
        check_device_count(ParallelConfig(tensor_parallel_size=2, data_parallel_size=4)
                           .num_devices, 1)
    check_device_count(8, 8)


def test_tp4_is_six_processes() -> None:
    topo = plan_topology(ParallelConfig(tensor_parallel_size=4))
    assert len(topo.processes) == 6
    assert [len(topo.by_role(r)) for r in (API_SERVER, ENGINE_CORE, WORKER, DP_COORDINATOR)] \
        == [1, 1, 4, 0]
    assert [p.device for p in topo.by_role(WORKER)] == [f"cuda:{i}" for i in range(4)]


def test_tp2_dp4_is_seventeen_processes() -> None:
    topo = plan_topology(ParallelConfig(tensor_parallel_size=2, data_parallel_size=4))
    assert len(topo.processes) == 17
    assert [len(topo.by_role(r)) for r in (API_SERVER, ENGINE_CORE, WORKER, DP_COORDINATOR)] \
        == [4, 4, 8, 1]
    workers = topo.by_role(WORKER)
    assert [p.parent for p in workers] == [f"EngineCore_DP{d}" for d in range(4) for _ in "ab"]
    assert [p.device for p in workers] == [f"cuda:{i}" for i in range(8)]


def test_pipeline_ranks_devices_and_links() -> None:
    topo = plan_topology(
        ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2),
        api_server_count=1, devices_per_node=4,
    )
    workers = topo.by_role(WORKER)
    assert [(p.dp_rank, p.pp_rank, p.tp_rank) for p in workers[:4]] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert workers[0].name == "Worker_PP0_TP0"
    assert workers[4].device == "node1/cuda:0"  # the second replica on the second node
    transports = [link.transport for link in topo.links]
    assert transports.count("torch.distributed (nccl)") == 2  # TP groups and PP chains
    assert any("Worker_PP1_TP0 (the output rank)" in link.ends for link in topo.links)
    cpu = plan_topology(ParallelConfig(tensor_parallel_size=2), device_kind="cpu")
    assert {p.device for p in cpu.by_role(WORKER)} == {"cpu"}
    assert "torch.distributed (gloo)" in [link.transport for link in cpu.links]


def _topology_cli(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "experiments.cli", "topology", *flags],
        capture_output=True, text=True, timeout=60,
    )


def test_topology_command_prints_the_counts() -> None:
    out = _topology_cli("-tp", "4")
    assert out.returncode == 0, out.stderr
    assert "6 processes under the launcher" in out.stdout
    out = _topology_cli("-tp", "2", "-dp", "4")
    assert "17 processes under the launcher" in out.stdout
    assert sum(line.startswith("Worker_TP") for line in out.stdout.splitlines()) == 8
    bad = _topology_cli("-tp", "2", "--distributed-executor-backend", "uni")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "twinserve: error: the uniprocess executor runs one rank; TP × PP = 2 needs the "
        "multiprocess executor (mp)"]


def test_serve_refuses_more_ranks_than_gpus_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import torch

    from engine.worker.tiny_model import TinyModelSpec, make_tiny_model
    from experiments.cli import main

    model = make_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(arch="llama"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine of 2 GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    code = main(["serve", "--model", str(model), "--device", "cuda", "--port", "0",
                 "-tp", "2", "-dp", "2"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "twinserve: error: the layout needs 4 GPUs (one per rank: TP × PP × DP) but this "
        "machine has 2; lower tensor/pipeline/data_parallel_size"]
