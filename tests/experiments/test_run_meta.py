"""One run-metadata record for both worlds: what ``config.json`` holds for a simulated run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from experiments.run_meta import simulated_run_meta
from reports.meta import RunMeta, to_jsonable
from sim.config import SimConfig
from sim.runtime import run_simulation


@pytest.fixture(scope="module")
def result():  # type: ignore[no-untyped-def]
    return run_simulation(SimConfig.from_dict({"workload": {
        "dataset_name": "random", "num_prompts": 30, "request_rate": 50.0,
        "random_input_len": 64, "random_output_len": 8}}))


def test_a_simulated_run_is_described_by_the_record(result) -> None:  # type: ignore[no-untyped-def]
    meta = simulated_run_meta(result)
    assert isinstance(meta, RunMeta) and meta.kind == "simulated"
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.label = "x"  # type: ignore[misc]
    d = meta.to_dict()
    assert list(d)[:4] == ["kind", "config", "engine_config", "model_id"]
    assert d["gpu"] == "h100-sxm" and d["tensor_parallel_size"] == 1
    assert "device" not in d and "label" not in d  # the other world's fields are left out
    stats = d["stats"]
    assert stats["duration_s"] == result.stats.simulated_time_s > 0
    assert stats["num_requests"] == 30 and isinstance(stats["num_steps"], int)
    assert "speed_drift" not in stats  # measured-only
    assert d["config"] == result.config.to_dict()
    for key in ("version", "git_commit", "date", "python", "compiled_modules"):
        assert key in d
    json.dumps(to_jsonable(d), allow_nan=False)  # what config.json is written from


def test_annotations_and_labels_keep_their_place(result) -> None:  # type: ignore[no-untyped-def]
    meta = dataclasses.replace(simulated_run_meta(result), label="simulated",
                               notes={"cost_model_scale": 1.5})
    d = meta.to_dict()
    assert list(d)[-2:] == ["label", "cost_model_scale"] and d["cost_model_scale"] == 1.5
