"""``twinserve serve -tp 2 -dp 2 --api-server-count 2`` on CPU: the live process tree is the one
``twinserve topology`` plans, both engines serve, and SIGTERM stops every process; the same
with DP 2 of emulated engines (the simulator's cost model behind the same server)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from engine.core.parallel import ParallelConfig
from engine.entrypoints.topology import LAUNCHER, plan_topology
from tests.serve.conftest import stop_and_check
from tests.serve.server import ServerProcess, command_line, descendants

#: multiprocessing's resource tracker: a helper every spawning Python process starts.
RESOURCE_TRACKER = "multiprocessing.resource_tracker"


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _live_tree(server: ServerProcess) -> Counter[tuple[str, str]]:
    """(process name, name of the process that started it) of every process under the
    launcher, the resource tracker left out."""
    root = server.proc.pid
    tree: Counter[tuple[str, str]] = Counter()
    for pid in descendants(root):
        if RESOURCE_TRACKER in command_line(pid):
            continue
        parent = _parent(pid)
        tree[(_comm(pid), LAUNCHER if parent == root else _comm(parent))] += 1
    return tree


def _generated_by_engine(server: ServerProcess) -> dict[str, float]:
    text = server.request("GET", "/metrics").body.decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:generation_tokens_total":
                engine = sample.labels["engine"]
                out[engine] = out.get(engine, 0.0) + sample.value
    return out


def test_tp2_dp2_serves_through_both_engines_and_stops_everything(tiny_model: Path) -> None:
    server = ServerProcess("--model", str(tiny_model), "--device", "cpu", "-tp", "2", "-dp", "2",
                           "--api-server-count", "2", "--router", "round_robin",
                           "--kv-cache-memory", "4MiB", "--max-num-seqs", "8")
    try:
        planned = plan_topology(
            ParallelConfig(tensor_parallel_size=2, data_parallel_size=2), api_server_count=2,
            device_kind="cpu",
        )
        assert len(planned.processes) == 9
        assert _live_tree(server) == Counter((p.name, p.parent) for p in planned.processes)

        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        texts = []
        for _ in range(6):
            reply = client.completions.create(model=str(tiny_model), prompt=[5, 6, 7, 8],
                                              max_tokens=6, temperature=0.0)
            texts.append(reply.choices[0].text)
        assert len(set(texts)) == 1  # every engine holds the same model: the same greedy text
        generated = _generated_by_engine(server)
        assert set(generated) == {"0", "1"} and all(v > 0 for v in generated.values()), \
            generated
    finally:
        status = stop_and_check(server)
    assert status == 0, server.output


def test_emulated_dp2_serves_through_both_engines_and_stops_everything() -> None:
    model = "meta-llama/Llama-3.1-8B"
    server = ServerProcess("--emulate", "--model", model, "-dp", "2", "--api-server-count", "1",
                           "--router", "round_robin")
    try:
        planned = plan_topology(ParallelConfig(data_parallel_size=2), api_server_count=1)
        assert len(planned.processes) == 4  # API server, 2 EngineCores, DP coordinator
        assert _live_tree(server) == Counter((p.name, p.parent) for p in planned.processes)

        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        for _ in range(4):
            reply = client.completions.create(model=model, prompt=[5, 6, 7, 8], max_tokens=5,
                                              temperature=0.0)
            assert reply.usage is not None and reply.usage.completion_tokens == 5
        # one API server routing round robin: each engine served two of the four requests
        assert _generated_by_engine(server) == {"0": 10.0, "1": 10.0}
    finally:
        status = stop_and_check(server)
    assert status == 0, server.output
