"""Every recorded vLLM 0.33.0 decision (tests/golden/scheduler) is reproduced step for step.

Comparison rules follow shared/hooks/same_steps.py: the scheduled and new maps compare as
dicts, resumed/preempted/finished as sets, running as an ordered list (it decides preemption
victims), free block counts exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.policy import PolicyContext, VllmPolicy
from experiments.replay import load_workload, replay

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "scheduler"
WORKLOADS = sorted(GOLDEN.glob("wl-*.json"), key=lambda p: int(p.stem.split("-")[1]))


def _normalise(record: dict) -> dict:
    r = dict(record)
    r["resumed"] = sorted(r.get("resumed", []))
    r["preempted"] = sorted(r.get("preempted", []))
    r["finished"] = sorted(map(tuple, r.get("finished", [])))
    return r


def test_all_golden_workloads_are_present() -> None:
    assert len(WORKLOADS) == 81 + 42


def test_pipeline_traces_keep_one_batch_per_stage() -> None:
    """The recorded pipeline-parallel traces (seeds 4000-4401) replay through an engine whose
    batch queue is exactly the PP degree, as vLLM's ``max_concurrent_batches``."""
    depths = {}
    for path in WORKLOADS:
        workload = load_workload(path)
        depth = json.loads(path.read_text())["config"].get("batch_queue_depth")
        if depth is not None:
            core_config = workload.engine_config
            assert core_config.pipeline_parallel_size == depth
            assert core_config.max_concurrent_batches == depth
            depths[depth] = depths.get(depth, 0) + 1
    assert depths == {2: 21, 4: 21}


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_replay_matches_vllm(path: Path) -> None:
    expected = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
    got = list(replay(load_workload(path)))
    assert len(got) == len(expected), f"{len(got)} steps, vLLM took {len(expected)}"
    for mine, theirs in zip(got, expected, strict=True):
        assert _normalise(mine) == _normalise(theirs), f"first difference at step {theirs['step']}"


class ThroughTheProtocol(VllmPolicy):
    """vLLM's policy, overriding nothing: the scheduler calls it through the protocol (the
    path of every custom policy) instead of running its inline decisions."""


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_replay_through_the_policy_protocol_matches_vllm(path: Path) -> None:
    """The seam itself is exact: vLLM's decisions made by calling the policy at each of the
    five decision points give every recorded step too."""
    expected = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
    workload = load_workload(path)
    policy = ThroughTheProtocol(PolicyContext(workload.engine_config.scheduler))
    got = list(replay(workload, policy))
    assert len(got) == len(expected), f"{len(got)} steps, vLLM took {len(expected)}"
    for mine, theirs in zip(got, expected, strict=True):
        assert _normalise(mine) == _normalise(theirs), f"first difference at step {theirs['step']}"
