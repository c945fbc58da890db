"""``--scheduling-policy`` end to end in ``simulate``, ``sweep`` and ``plan``: shipped names,
options, and a user's policy class written in this file, loaded by its path; each kind of bad
input is one ``twinserve: error:`` line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest

from engine.core.policy import ADMIT, ALL_BULK_PROPERTIES, Admission, AdmissionView
from engine.core.queues import RequestQueue
from engine.core.request import Request
from experiments.cli import main

USER_POLICY = f"{__name__}:NewestFirst"
SMALL = ["--dataset-name", "random", "--num-prompts", "40", "--random-input-len", "200",
         "--random-output-len", "20", "--request-rate", "40", "--max-num-seqs", "4"]


class NewestFirstQueue:
    """LIFO: the newest request is admitted first (a preempted one resumes first)."""

    def __init__(self) -> None:
        self.items: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.items.append(request)

    def pop_request(self) -> Request:
        return self.items.pop()

    def peek_request(self) -> Request:
        if not self.items:
            raise IndexError("peek from an empty queue")
        return self.items[-1]

    def prepend_request(self, request: Request) -> None:
        self.items.append(request)

    def prepend_requests(self, requests: Sequence[Request]) -> None:
        self.items.extend(requests)

    def remove_requests(self, requests: Sequence[Request]) -> None:
        drop = {id(r) for r in requests}
        self.items = [r for r in self.items if id(r) not in drop]

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(reversed(self.items))


class NewestFirst:
    """A user's policy: last come, first served; everything else as vLLM."""

    name = "newest-first"
    needs_slos = False
    bulk_properties = ALL_BULK_PROPERTIES

    def __init__(self, context: object) -> None:
        pass

    def new_waiting_queue(self) -> RequestQueue:
        return NewestFirstQueue()  # type: ignore[return-value]

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return 0


def test_simulate_with_a_users_policy(tmp_path: Path) -> None:
    assert main(["simulate", "--no-plots", "--out", str(tmp_path / "lifo"),
                 "--scheduling-policy", USER_POLICY, *SMALL]) == 0
    assert main(["simulate", "--no-plots", "--out", str(tmp_path / "fifo"), *SMALL]) == 0
    meta = json.loads((tmp_path / "lifo" / "config.json").read_text())
    assert meta["scheduling_policy"] == {"name": "newest-first", "class": USER_POLICY,
                                         "options": {}, "bulk_fast_path": "on"}
    assert meta["config"]["engine"]["policy"] == USER_POLICY
    lifo = pd.read_parquet(tmp_path / "lifo" / "requests.parquet")
    fifo = pd.read_parquet(tmp_path / "fifo" / "requests.parquet")
    assert lifo["success"].all() and fifo["success"].all()
    # a queue forms (4 seats): FIFO admits in arrival order, LIFO does not
    assert fifo.sort_values("scheduled_s")["req_index"].is_monotonic_increasing
    assert not lifo.sort_values("scheduled_s")["req_index"].is_monotonic_increasing


def test_simulate_with_slo_classes_tenants_and_a_shipped_policy(tmp_path: Path) -> None:
    assert main(["simulate", "--no-plots", "--out", str(tmp_path), *SMALL,
                 "--scheduling-policy", "sjf", "--policy-option", "predictor=noisy",
                 "noise_sigma=0.3", "--slo-classes", "chat:300:30", "batch:9000:300",
                 "--slo-class-mix", "chat:0.5", "batch:0.5", "--tenant-mix", "a:0.7",
                 "b:0.3"]) == 0
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["scheduling_policy"]["options"] == {"predictor": "noisy", "noise_sigma": 0.3}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["by_tenant"]) == {"a", "b"}
    assert set(summary["by_slo_class"]) == {"chat", "batch"}
    report = (tmp_path / "report.md").read_text()
    assert ("Scheduling policy sjf (engine.policies.sjf:ShortestJobFirst; noise_sigma=0.3, "
            "predictor=noisy) · bulk fast path: on.") in report
    assert "## By tenant and SLO class" in report


@pytest.mark.parametrize("args,message", [
    (["--scheduling-policy", "lottery"], "policy: unknown scheduling policy 'lottery'; valid: "
     "fcfs, priority, sjf, srpt, edf, vtc, decode-first, prefill-first, shed, or "
     "package.module:ClassName"),
    (["--scheduling-policy", "no.such.module:Policy"],
     "scheduling policy 'no.such.module:Policy': cannot import module 'no.such.module'"),
    (["--scheduling-policy", f"{__name__}:NewestFirstQueue"],
     f"{__name__}:NewestFirstQueue is not a scheduling policy: it lacks new_waiting_queue, "
     "order_running, pick_victim, admit, prefill_chunk_limit"),
    (["--scheduling-policy", "edf"], "scheduling policy 'edf' needs per-request SLOs"),
    (["--scheduling-policy", "shed", "--slo-classes", "a:100:10", "b:200:20"],
     "slo_classes defines 2 classes but nothing says which request has which"),
    (["--scheduling-policy", "decode-first", "--policy-option", "chunk=0"],
     "chunk must be >= 1 token, got 0"),
    (["--scheduling-policy", "sjf", "--policy-option", "predictor=bucket",
      "--policy-option", "fit_on=nowhere.csv"], "trace file 'nowhere.csv' not found"),
    (["--slo-class-mix", "gold:1"], "slo_class_mix names class(es) 'gold' that slo_classes "
     "does not define"),
])
def test_bad_policy_input_is_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--no-plots", "--out", str(tmp_path), *SMALL, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twinserve: error: ") and message in err[0]


def test_sweep_compares_shipped_and_user_policies(tmp_path: Path) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text(f"""
name = "policies"
[base]
model = "meta-llama/Llama-3.1-8B"
[base.engine]
max_num_seqs = 4
[base.workload]
dataset_name = "random"
num_prompts = 30
random_input_len = 300
random_output_len = 20
tenant_mix = [["a", 0.5], ["b", 0.5]]
slo_classes = [["chat", 200, 40]]
[grid]
"workload.request_rate" = [30]
[[variant]]
name = "fcfs"
scheduling_policy = "fcfs"
[[variant]]
name = "user"
scheduling_policy = "{USER_POLICY}"
[[variant]]
name = "vtc"
scheduling_policy = "vtc"
[[variant]]
name = "weights"
scheduling_policy = "vtc"
"engine.policy_options" = {{input_weight = 0.0, output_weight = 1.0}}
[[variant]]
name = "edf"
scheduling_policy = "edf"
[report]
goodput = ["ttft:200"]
""")
    assert main(["sweep", str(exp), "--out", str(tmp_path / "out"), "-j", "1"]) == 0
    table = pd.read_csv(tmp_path / "out" / "results.csv")
    assert set(table["engine.policy"]) == {"fcfs", "vtc", "edf", USER_POLICY}
    weights = table[table["variant"] == "weights"]
    assert list(weights["engine.policy_options"]) == [
        '{"input_weight": 0.0, "output_weight": 1.0}'
    ]
    assert {"tenant_a_num_requests", "class_chat_slo_attainment"} <= set(table.columns)
    assert (table["tenant_a_num_requests"] + table["tenant_b_num_requests"] == 30).all()
    # Each point says what the bulk fast path did with its policy (NewestFirst declares all;
    # edf reorders the running requests, so no bulk run applies).
    fast = dict(zip(table["variant"], table["bulk_fast_path"], strict=True))
    assert fast.pop("edf").startswith("off: policy 'edf' does not declare running_order")
    assert set(fast.values()) == {"on"}
    classes = dict(zip(table["variant"], table["policy_class"], strict=True))
    assert classes["user"] == USER_POLICY
    assert classes["fcfs"] == "engine.core.policy:VllmPolicy"


def test_plan_with_a_users_policy(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    assert main(["plan", "--gpus", "h100-sxm", "--slo", "ttft:300", "tpot:40", "--out",
                 str(out), "--scheduling-policy", USER_POLICY, "--dataset-name", "random",
                 "--num-prompts", "30", "--random-input-len", "256", "--random-output-len",
                 "16", "--seeds", "1", "--tolerance", "0.3", "--max-probes", "5",
                 "--rate-start", "8", "-j", "1"]) == 0
    assert len(pd.read_csv(out / "plan.csv")) == 1
    records = [json.loads(p.read_text())["record"] for p in (out / "cache").glob("*.json")]
    assert records and all(r["engine.policy"] == USER_POLICY for r in records)


def test_the_twinserve_command_finds_a_policy_module_in_the_current_directory(
    tmp_path: Path,
) -> None:
    """The installed console script (whose sys.path does not hold the working directory, as
    ``python -m`` would) loads ``mypolicy.py`` from where it runs."""
    import subprocess
    import sys

    (tmp_path / "mypolicy.py").write_text(
        "from engine.core.policy import VllmPolicy\n\n\n"
        "class Mine(VllmPolicy):\n"
        "    def __init__(self, context):\n"
        "        super().__init__(context)\n"
        "        self.name = 'mine'\n"
    )
    twinserve = Path(sys.executable).parent / "twinserve"
    proc = subprocess.run(
        [str(twinserve), "simulate", "--no-plots", "--out", str(tmp_path / "run"), *SMALL,
         "--num-prompts", "5", "--scheduling-policy", "mypolicy:Mine"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["scheduling_policy"]["name"] == "mine"
