"""The same scheduling policy drives a simulation and a real run on the tiny model, and with a
scripted executor that takes fixed step times the two make the same decisions.

The real run is ``engine.serve.real_run.run_real`` on the tiny checkpoint (its config,
tokenizer, KV cache and request validation) with the executor replaced by a script: every step
takes ``STEP_S`` on a virtual clock (which the run's idle waits advance too) and every sampling
request samples one token — or the tiny model's own executor runs every step (forward pass and
sampling) and only the step time is scripted. The simulation serves the same request stream
with a cost model that prices every step at ``STEP_S`` and a front end that costs nothing.
Times are multiples of 1/256 s, exact in binary floating point, so both worlds see arrivals and
steps at the very same instants; the decisions — who is scheduled how many tokens in each step,
who is preempted, who is shed and why, who finishes when — must then be identical.

Plus ``twinserve run-real`` end to end on the tiny model with a policy class written here,
loaded by ``--scheduling-policy``, and the one-line errors of a bad policy.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.core.config import EngineKnobs
from engine.core.events import EventKind
from engine.core.interfaces import StepTime
from engine.core.outputs import BatchShape, ModelRunnerOutput, SchedulerOutput
from engine.core.policy import AdmissionView, VllmPolicy
from engine.core.request import Request
from engine.core.slo import SLOClass
from engine.llm import EngineArgs
from engine.serve.real_run import run_real, stream_info
from experiments.cli import main
from sim.config import FrontendConfig, SimConfig
from sim.runtime import SimRuntime
from workload.stream import Workload

STEP_S = 1 / 64
TOKEN = 7


class LongestPromptFirstAfterAWhile(VllmPolicy):
    """A user's policy for this test: vLLM's, but the waiting queue serves the longest prompt
    first, and no request is admitted in the first 50 ms of the run (admit-now says wait)."""

    def new_waiting_queue(self) -> Any:
        from engine.policies.keyed_queue import KeyedRequestQueue

        return KeyedRequestQueue(lambda r: (-r.num_prompt_tokens, r.arrival_time))

    def admit(self, request: Request, view: AdmissionView) -> Any:
        from engine.core.policy import ADMIT, WAIT

        return WAIT if view.now_s < 0.05 else ADMIT


class VirtualClock:
    """A ``RunClock`` that moves only when told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class ScriptedExecutor:
    """Each non-empty step takes ``STEP_S`` on the clock; every sampling request samples
    ``TOKEN``."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        if sched_out.total_num_scheduled_tokens:
            self.clock.t += STEP_S
        partial = sched_out.partial_prefill_req_ids
        return ModelRunnerOutput(
            {r: [TOKEN] for r in sched_out.num_scheduled_tokens if r not in partial}
        )


class TimedTorchExecutor:
    """The tiny model's own executor runs every step (forward pass, sampling); only the time a
    step takes is scripted: ``STEP_S`` on the virtual clock."""

    def __init__(self, inner: Any, clock: VirtualClock) -> None:
        self.inner = inner
        self.clock = clock

    def execute_model(self, sched_out: SchedulerOutput) -> ModelRunnerOutput:
        out: ModelRunnerOutput = self.inner.execute_model(sched_out)
        if sched_out.total_num_scheduled_tokens:
            self.clock.t += STEP_S
        return out


@dataclasses.dataclass(frozen=True)
class FixedStepCost:
    """Every non-empty step takes ``STEP_S``."""

    def step_time(self, shape: BatchShape) -> StepTime:
        return StepTime(STEP_S if shape.num_tokens else 0.0)


FREE_FRONTEND = FrontendConfig(
    request_overhead_s=0.0, tokenize_s_per_token=0.0, ipc_latency_s=0.0,
    detokenize_s_per_token=0.0, output_batch_overhead_s=0.0, network_latency_s=0.0,
    schedule_overhead_s=0.0, schedule_s_per_request=0.0, update_overhead_s=0.0,
)
CLASSES = (SLOClass("chat", 0.1, 0.03), SLOClass("batch", 2.0, 0.2))


def stream(n: int = 36, seed: int = 0) -> Workload:
    """Bursty arrivals on a 1/256 s grid, two tenants, two SLO classes."""
    rng = np.random.default_rng(seed)
    gaps = rng.choice([0, 0, 0, 1, 3, 9, 40], size=n)
    return Workload(
        send_time_s=np.cumsum(gaps) / 256.0,
        prompt_lens=rng.integers(4, 90, n), output_lens=rng.integers(1, 24, n),
        priorities=np.zeros(n, dtype=np.int64), shared_prefix_ids=np.full(n, -1),
        shared_prefix_lens=np.zeros(n, dtype=np.int64), max_concurrency=None,
        source="scripted", tenants=("a", "b"),
        tenant_ids=rng.integers(0, 2, n).astype(np.int32), slo_classes=CLASSES,
        slo_class_ids=rng.integers(0, 2, n).astype(np.int32),
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    assert main(["make-tiny-model", str(d)]) == 0
    return d


KNOBS = EngineKnobs(max_num_batched_tokens=64, max_num_seqs=4, async_scheduling=False,
                    enable_prefix_caching=False)
NUM_BLOCKS = 12  # 11 usable blocks of 16 tokens: preemptions happen
MAX_MODEL_LEN = 128


def decisions(log: Any) -> dict[str, Any]:
    """What the scheduler decided, from an event log: every step's composition and when it
    was scheduled, and each request's scheduling events (time, kind, payload) in time order."""
    steps = log.steps_columns()
    names = ("step_id", "schedule_time_s", "num_reqs", "num_tokens", "num_prefill_reqs",
             "num_prefill_tokens", "num_decode_reqs", "num_new_reqs", "num_resumed_reqs",
             "num_preempted_reqs", "num_finished_reqs", "num_running", "num_waiting",
             "admission_blocker")
    ev = log.events_columns()
    kept = {EventKind.SCHEDULED, EventKind.PREEMPTED, EventKind.REJECTED, EventKind.FINISHED,
            EventKind.FIRST_TOKEN}
    per_request: dict[str, list[tuple[float, str, object]]] = {}
    for r, k, t, p in zip(ev["req_index"], ev["kind"], ev["time_s"], ev["payload"], strict=True):
        if k in kept:
            per_request.setdefault(log.req_ids[r], []).append((t, EventKind(k).name, p))
    for events in per_request.values():
        events.sort(key=lambda e: (e[0], EventKind[e[1]]))
    runs = log.token_runs()
    return {
        "steps": {n: list(steps[n]) for n in names},
        "events": per_request,
        "token_runs": sorted(
            (log.req_ids[r], f, c) for r, f, c in zip(*runs.values(), strict=True)
        ),
    }


def simulated(policy: str, options: dict[str, Any], w: Workload, max_model_len: int) -> Any:
    cfg = SimConfig(
        engine=dataclasses.replace(KNOBS, policy=policy, policy_options=options),
        frontend=FREE_FRONTEND, num_gpu_blocks=NUM_BLOCKS, max_model_len=max_model_len,
        workload=dataclasses.replace(SimConfig().workload, slo_classes=(("chat", 100, 30),)),
    )
    return SimRuntime(cfg, workload=w, cost_model=FixedStepCost()).run()


def measured(
    tiny: Path, policy: str, options: dict[str, Any], w: Workload, model_runs: bool = False
) -> Any:
    """A real run of ``w``; the executor is the script, or with ``model_runs`` the tiny model's
    own executor with scripted step times."""
    args = EngineArgs(model=str(tiny), num_gpu_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN,
                      engine=dataclasses.replace(KNOBS, policy=policy, policy_options=options))
    engine = args.build(stream=stream_info(w, seed=0))
    clock = VirtualClock()
    script = TimedTorchExecutor(engine.executor, clock) if model_runs else ScriptedExecutor(clock)
    engine.executor = script  # type: ignore[assignment]
    return engine, run_real(engine, w, run_clock=clock)


POLICIES: list[tuple[str, dict[str, Any]]] = [
    ("fcfs", {}),
    ("shed", {}),
    ("edf", {}),
    ("vtc", {}),
    ("sjf", {"predictor": "noisy", "noise_sigma": 1.0}),
    ("srpt", {"predictor": "bucket", "num_buckets": 4}),
    ("decode-first", {"chunk": 24}),
    ("prefill-first", {"chunk": 24}),
    (f"{__name__}:LongestPromptFirstAfterAWhile", {}),
]
#: Each with the script, and with the tiny model's own executor doing every step.
CASES = [(p, o, m) for m in (False, True) for p, o in POLICIES]


@pytest.mark.parametrize("policy,options,model_runs", CASES,
                         ids=[p + ("-model" if m else "") for p, _, m in CASES])
def test_the_real_run_decides_as_the_simulation_with_fixed_step_times(
    tiny: Path, policy: str, options: dict[str, Any], model_runs: bool
) -> None:
    w = stream()
    engine, real = measured(tiny, policy, options, w, model_runs)
    sim = simulated(policy, options, w, engine.engine_config.scheduler.max_model_len)
    assert engine.engine_config == sim.engine_config
    got, want = decisions(real.event_log), decisions(sim.event_log)
    assert got["steps"]["num_tokens"], "nothing ran"
    # the simulated engine ships the last finished ids in one more, empty, step; the real run
    # stops once every request is delivered
    n = len(got["steps"]["step_id"])
    assert all(t == 0 for t in want["steps"]["num_tokens"][n:])
    want["steps"] = {k: v[:n] for k, v in want["steps"].items()}
    assert got == want
    assert real.reject_reasons == sim.reject_reasons
    assert real.scheduling_policy["class"] == sim.scheduling_policy["class"]
    if policy == "shed":
        assert real.reject_reasons, "the burst should shed chat requests"
    if policy == "fcfs":
        assert max(got["steps"]["num_preempted_reqs"]) > 0, "the KV cache should run out"


# -- twinserve run-real with a user's policy, end to end -----------------------------------------
class ShortestPromptFirst:
    """A user's policy written from scratch (no base class): shortest prompt first."""

    name = "shortest-prompt-first"
    needs_slos = False

    def __init__(self, context: Any) -> None:
        from engine.core.policy import ALL_BULK_PROPERTIES

        self.bulk_properties = ALL_BULK_PROPERTIES

    def new_waiting_queue(self) -> Any:
        from engine.policies.keyed_queue import KeyedRequestQueue

        return KeyedRequestQueue(lambda r: (r.num_prompt_tokens,))

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Any:
        from engine.core.policy import ADMIT

        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return 0


def test_run_real_loads_a_users_policy_by_path(tiny: Path, tmp_path: Path) -> None:
    path = f"{__name__}:ShortestPromptFirst"
    assert main(["run-real", "--model", str(tiny), "--kv-cache-memory", "2MiB", "--no-plots",
                 "--out", str(tmp_path), "--dataset-name", "random", "--num-prompts", "6",
                 "--random-input-len", "24", "--random-output-len", "3",
                 "--random-range-ratio", "0.9", "--max-num-seqs", "1",
                 "--scheduling-policy", path, "--tenant-mix", "a:0.5", "b:0.5"]) == 0
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["scheduling_policy"]["name"] == "shortest-prompt-first"
    assert meta["scheduling_policy"]["class"] == path
    from reports.run_dir import load_run_dir

    _, tables = load_run_dir(tmp_path)
    req = tables.requests.sort_values("scheduled_s")
    # one at a time: after the first (alone at t = 0 or not), the shortest waiting prompt next
    assert req["success"].all() and set(req["tenant"].astype(str)) <= {"a", "b"}
    waiting_order = list(req["num_prompt_tokens"])[1:]
    assert waiting_order == sorted(waiting_order) or len(set(req["scheduled_s"])) < len(req)


@pytest.mark.parametrize("argv,message", [
    (["--scheduling-policy", "no_such_mod:Policy"],
     "twinserve: error: scheduling policy 'no_such_mod:Policy': cannot import module"),
    (["--scheduling-policy", f"{__name__}:VirtualClock"],
     "is not a scheduling policy: it lacks new_waiting_queue"),
    (["--scheduling-policy", "edf"], "'edf' needs per-request SLOs"),
    (["--scheduling-policy", "sjf", "--policy-option", "predictor=psychic"],
     "unknown predictor 'psychic'"),
])
def test_run_real_refuses_a_bad_policy_in_one_line(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
    message: str,
) -> None:
    rc = main(["run-real", "--model", str(tiny), "--kv-cache-memory", "2MiB", "--no-plots",
               "--out", str(tmp_path / "r"), "--dataset-name", "random", "--num-prompts", "2",
               "--random-input-len", "8", "--random-output-len", "2", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
