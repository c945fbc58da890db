"""The policy seam: building policies by name or path, the protocol check, bad input (one clear
error each), the bulk properties a policy keeps, and a user's policy written here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from engine.core.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    EngineKnobs,
    SchedulerConfig,
)
from engine.core.policy import (
    ADMIT,
    ALL_BULK_PROPERTIES,
    Admission,
    AdmissionView,
    BulkProperty,
    PolicyContext,
    PolicyError,
    StreamInfo,
    VllmPolicy,
    build_policy,
    describe_bulk,
    policy_class,
)
from engine.core.policy_names import SHIPPED
from engine.core.queues import FCFSRequestQueue, RequestQueue
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from tests.core.utils import create_requests, step


class LongestPromptFirst:
    """A user's own policy: admit the longest prompt first, otherwise vLLM's decisions."""

    name = "longest-prompt-first"
    needs_slos = False
    bulk_properties = ALL_BULK_PROPERTIES

    def __init__(self, context: PolicyContext) -> None:
        self.threshold = context.scheduler.long_prefill_token_threshold

    def new_waiting_queue(self) -> RequestQueue:
        from engine.policies.keyed_queue import KeyedRequestQueue

        return KeyedRequestQueue(lambda r: (-r.num_prompt_tokens,))

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def pick_victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def admit(self, request: Request, view: AdmissionView) -> Admission:
        return ADMIT

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return self.threshold if num_unfinished_requests > 1 else 0


class NoVictim:
    """Lacks pick_victim and admit: not a policy."""

    name = "broken"
    needs_slos = False
    bulk_properties = frozenset()

    def __init__(self, context: PolicyContext) -> None: ...

    def new_waiting_queue(self) -> RequestQueue:
        return FCFSRequestQueue()

    def order_running(self, running: Sequence[Request]) -> list[Request] | None:
        return None

    def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
        return 0


class BadProperties(LongestPromptFirst):
    bulk_properties = {"running_order"}  # type: ignore[assignment]  # noqa: RUF012  (a set of strings)


class NoContext(LongestPromptFirst):
    def __init__(self) -> None:  # type: ignore[override]
        pass


def _sc(policy: str, **kw: Any) -> SchedulerConfig:
    values: dict[str, Any] = {"max_num_batched_tokens": 64, "max_num_seqs": 4,
                              "max_model_len": 256, **kw}
    return SchedulerConfig(policy=policy, **values)


def _scheduler(policy: str, **kw: Any) -> Scheduler:
    return Scheduler(EngineConfig(_sc(policy, **kw), CacheConfig(num_gpu_blocks=100)))


HERE = __name__


def test_every_shipped_name_builds_a_policy_that_satisfies_the_protocol() -> None:
    for name in SHIPPED:
        policy = build_policy(PolicyContext(_sc(name), StreamInfo(has_slos=True)))
        assert policy.name == name
        assert isinstance(policy.bulk_properties, frozenset)


def test_vllms_policy_runs_inline_and_any_other_through_the_protocol() -> None:
    assert _scheduler("fcfs").custom_policy is None
    assert _scheduler("priority").custom_policy is None and _scheduler("priority").priority_policy
    assert _scheduler("sjf").custom_policy is not None
    sched = _scheduler(f"{HERE}:LongestPromptFirst")
    assert isinstance(sched.custom_policy, LongestPromptFirst)


def test_a_users_policy_by_path_decides_the_waiting_order() -> None:
    sched = _scheduler(f"{HERE}:LongestPromptFirst", max_num_seqs=1)
    for r in create_requests(3, prompt_token_ids=[[1] * 5, [2] * 30, [3] * 12]):
        sched.add_request(r)
    order = []
    while sched.has_unfinished_requests():
        order += [n.req_id for n in step(sched).scheduled_new_reqs]
    assert order == ["1", "2", "0"]


@pytest.mark.parametrize("name,message", [
    ("no_such_package.mod:Cls", "cannot import module 'no_such_package.mod'"),
    (f"{HERE}:Missing", f"module '{HERE}' has no class 'Missing' (found nothing)"),
    (f"{HERE}:HERE", f"module '{HERE}' has no class 'HERE' (found a str)"),
    (f"{HERE}:NoVictim", "is not a scheduling policy: it lacks pick_victim, admit"),
    (f"{HERE}:BadProperties",
     "BadProperties is not a scheduling policy: it lacks bulk_properties (a frozenset of "
     "BulkProperty)"),
    (f"{HERE}:NoContext", "a policy class takes one argument, a PolicyContext"),
])
def test_a_bad_policy_is_one_clear_error(name: str, message: str) -> None:
    with pytest.raises(PolicyError) as exc:
        build_policy(PolicyContext(_sc(name)))
    assert str(exc.value).startswith(f"scheduling policy {name!r}: ")
    assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(PolicyError, match="unknown scheduling policy 'nope'; valid: fcfs"):
        policy_class("nope")


def test_a_misspelt_policy_name_is_a_config_error_naming_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown scheduling policy 'sfj'; valid: fcfs"):
        EngineKnobs(policy="sfj")
    with pytest.raises(ConfigError, match="unknown scheduling policy 'a:b:c'"):
        SchedulerConfig(policy="a:b:c")


@pytest.mark.parametrize("policy,options,message", [
    ("sjf", {"predictor": "magic"}, "unknown predictor 'magic'; valid: oracle, bucket, noisy"),
    ("sjf", {"noise": 1.0}, "has no option(s) noise; valid: predictor (default 'oracle')"),
    ("decode-first", {"chunk": "big"}, "option chunk must be int (like its default 512)"),
    ("decode-first", {"chunk": 0}, "chunk must be >= 1 token, got 0"),
    ("fcfs", {"x": 1}, "scheduling policy 'fcfs' has no option(s) x; valid: none"),
    ("sjf", {"predictor": "bucket"}, "give the option fit_on=TRACE"),
    ("sjf", {"noise_sigma": 0.2}, "option(s) noise_sigma do nothing with predictor 'oracle'"),
    ("srpt", {"predictor": "noisy", "fit_on": "azure-conv"},
     "option(s) fit_on do nothing with predictor 'noisy'"),
    ("shed", {"slack": -1.0}, "slack must be > 0"),
])
def test_bad_policy_options_are_one_clear_error(
    policy: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError) as exc:
        build_policy(PolicyContext(_sc(policy, policy_options=options)))
    assert message in str(exc.value)


def test_a_policy_that_needs_slos_refuses_requests_without_them() -> None:
    for name in ("edf", "shed"):
        with pytest.raises(PolicyError, match=f"'{name}' needs per-request SLOs"):
            build_policy(PolicyContext(_sc(name), StreamInfo(has_slos=False)))
        build_policy(PolicyContext(_sc(name), StreamInfo(has_slos=True)))


def test_policy_options_normalise_to_sorted_pairs_and_round_trip() -> None:
    knobs = EngineKnobs.from_dict({"policy": "sjf", "policy_options": {"z": 1, "a": "x"}})
    assert knobs.policy_options == (("a", "x"), ("z", 1))
    assert EngineKnobs(policy="sjf", policy_options=[["a", "x"], ["z", 1]]) == knobs
    with pytest.raises(ConfigError, match="policy_options: z must be a string, a finite number"):
        EngineKnobs(policy_options={"z": float("nan")})
    with pytest.raises(ConfigError, match="a table of option = value"):
        EngineKnobs(policy_options=5)  # type: ignore[arg-type]


def test_a_policy_must_return_a_permutation_and_a_running_victim() -> None:
    class Drops(LongestPromptFirst):
        def order_running(self, running: Sequence[Request]) -> list[Request] | None:
            return list(running)[1:]

    sc = _sc("fcfs")
    sched = Scheduler(EngineConfig(sc, CacheConfig(num_gpu_blocks=100)),
                      policy=Drops(PolicyContext(sc)))
    for r in create_requests(2):
        sched.add_request(r)
    step(sched)
    with pytest.raises(ValueError, match="order_running must return a permutation"):
        sched.schedule()

    class Outsider(LongestPromptFirst):
        def pick_victim(self, running: Sequence[Request]) -> Request:
            return create_requests(1, req_ids=["ghost"])[0]

    sc = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64,
                         scheduler_reserve_full_isl=False)
    sched = Scheduler(EngineConfig(sc, CacheConfig(num_gpu_blocks=3, block_size=4)),
                      policy=Outsider(PolicyContext(sc)))
    for r in create_requests(2, num_tokens=4, block_size=4):
        sched.add_request(r)
    step(sched)
    with pytest.raises(ValueError, match="pick_victim must return a running request"):
        step(sched)


def test_a_subclass_of_vllms_policy_keeps_only_the_properties_it_does_not_override() -> None:
    class Reorders(VllmPolicy):
        def order_running(self, running: Sequence[Request]) -> list[Request] | None:
            return None

    class Chunks(VllmPolicy):
        def prefill_chunk_limit(self, num_unfinished_requests: int) -> int:
            return 8

    sc = _sc("fcfs")
    assert VllmPolicy(PolicyContext(sc)).bulk_properties == ALL_BULK_PROPERTIES
    assert BulkProperty.RUNNING_ORDER not in Reorders(PolicyContext(sc)).bulk_properties
    chunks = Chunks(PolicyContext(sc))
    assert chunks.bulk_properties == {BulkProperty.RUNNING_ORDER, BulkProperty.ADMISSION}
    assert describe_bulk(chunks) == (
        "limited: policy 'fcfs' does not declare chunking; no bulk run plans an admission, "
        "and none includes a prefill chunk"
    )


@pytest.mark.parametrize("name,words", [
    ("fcfs", "on"), ("sjf", "on"), ("srpt", "on"), ("vtc", "on"),
    ("edf", "off: policy 'edf' does not declare running_order (every bulk run relies on it)"),
    ("prefill-first", "off: policy 'prefill-first' does not declare running_order"),
    ("decode-first", "limited: policy 'decode-first' does not declare chunking"),
    ("shed", "limited: policy 'shed' does not declare admission; no bulk run plans an "
             "admission"),
])
def test_what_the_bulk_path_does_with_each_shipped_policy(name: str, words: str) -> None:
    policy = build_policy(PolicyContext(_sc(name), StreamInfo(has_slos=True)))
    assert describe_bulk(policy).startswith(words)


def test_policy_class_resolves_shipped_names_and_paths() -> None:
    assert policy_class("fcfs") is VllmPolicy
    assert policy_class(f"{HERE}:LongestPromptFirst") is LongestPromptFirst
