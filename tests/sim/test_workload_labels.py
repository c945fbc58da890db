"""Tenants and SLO classes in workloads: drawn from mixes with the seed, read from trace
columns, checked (one clear error per mistake), and carried to the requests table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.core.slo import SLOClass
from sim.config import SimConfig
from sim.runtime import run_simulation
from workload.build import build_workload
from workload.config import WorkloadConfig
from workload.errors import WorkloadError

CLASSES = (("chat", 500, 50), ("batch", 10000, 200))


def test_mixes_draw_tenants_and_classes_with_the_seed() -> None:
    cfg = WorkloadConfig(num_prompts=2000, tenant_mix=(("a", 0.25), ("b", 0.75)),
                         slo_classes=CLASSES, slo_class_mix=(("chat", 0.4), ("batch", 0.6)))
    w = build_workload(cfg)
    assert w.tenants == ("a", "b") and w.slo_classes == (
        SLOClass("chat", 0.5, 0.05), SLOClass("batch", 10.0, 0.2))
    assert abs(np.mean(w.tenant_ids == 1) - 0.75) < 0.04
    assert abs(np.mean(w.slo_class_ids == 0) - 0.4) < 0.04
    again = build_workload(cfg)
    assert (again.tenant_ids == w.tenant_ids).all()
    assert (again.slo_class_ids == w.slo_class_ids).all()
    # the labels draw from their own streams: lengths and arrivals are those without labels
    plain = build_workload(WorkloadConfig(num_prompts=2000))
    assert (plain.prompt_lens == w.prompt_lens).all()
    assert (plain.send_time_s == w.send_time_s).all()
    assert w.tenant(0) in ("a", "b") and w.slo_class(0) in w.slo_classes
    assert plain.tenant(0) == "" and plain.slo_class(0) is None and not plain.has_labels


def test_one_class_applies_to_every_request() -> None:
    w = build_workload(WorkloadConfig(num_prompts=5, slo_classes=(("all", 300, 30),)))
    assert w.has_slos and {w.slo_class(i).name for i in range(5)} == {"all"}  # type: ignore[union-attr]


def _trace(tmp_path: Path, header: str, rows: list[str]) -> str:
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def test_a_trace_gives_each_request_its_tenant_and_class(tmp_path: Path) -> None:
    path = _trace(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,tenant,slo_class",
                  ["0.0,10,5,a,chat", "0.5,20,5,b,batch", "0.2,30,5,b,chat"])
    w = build_workload(WorkloadConfig(dataset_name="trace", dataset_path=path,
                                      slo_classes=CLASSES))
    # sorted by arrival: rows 0, 2, 1
    assert [w.tenant(i) for i in range(3)] == ["a", "b", "b"]
    assert [w.slo_class(i).name for i in range(3)] == ["chat", "chat", "batch"]  # type: ignore[union-attr]
    assert list(w.prompt_lens) == [10, 30, 20]


def test_a_mooncake_trace_may_carry_labels(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1],
             "tenant": "x", "slo_class": "batch"},
            {"timestamp": 5, "input_length": 12, "output_length": 3, "hash_ids": [2],
             "tenant": "y", "slo_class": "chat"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = build_workload(WorkloadConfig(dataset_name="trace", dataset_path=str(path),
                                      slo_classes=CLASSES))
    assert [w.tenant(i) for i in range(2)] == ["x", "y"]
    assert [w.slo_class(i).name for i in range(2)] == ["batch", "chat"]  # type: ignore[union-attr]


@pytest.mark.parametrize("rows,config,message", [
    (["0,10,5,a,gold"], {"slo_classes": CLASSES},
     "the trace names SLO class(es) 'gold' that slo_classes does not define (defined: chat, "
     "batch)"),
    (["0,10,5,a,chat"], {}, "slo_classes does not define (defined: none)"),
    (["0,10,5,,chat"], {"slo_classes": CLASSES}, "column tenant is empty for request 0"),
    (["0,10,5,a,chat"], {"slo_classes": CLASSES, "tenant_mix": (("z", 1.0),)},
     "the trace gives each request a tenant (its tenant column) and tenant_mix draws them too"),
    (["0,10,5,a,chat"], {"slo_classes": CLASSES, "slo_class_mix": (("chat", 1.0),)},
     "its slo_class column) and slo_class_mix draws them too"),
])
def test_bad_trace_labels_are_one_clear_error(
    tmp_path: Path, rows: list[str], config: dict, message: str
) -> None:
    path = _trace(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,tenant,slo_class",
                  rows)
    with pytest.raises(WorkloadError) as exc:
        build_workload(WorkloadConfig(dataset_name="trace", dataset_path=path, **config))
    assert message in str(exc.value)


@pytest.mark.parametrize("config,message", [
    ({"slo_class_mix": (("chat", 1.0),)},
     "slo_class_mix names class(es) 'chat' that slo_classes does not define (defined: none)"),
    ({"slo_classes": (("chat", 0, 50),)}, "the ttft target must be a number > 0"),
    ({"slo_classes": (("chat", 500, 50), ("chat", 1, 1))}, "slo_classes defines a class twice"),
    ({"tenant_mix": (("a", 0.5), ("b", 0.4))}, "tenant_mix fractions must be >= 0 and sum to 1"),
    ({"tenant_mix": (("a", 0.5), ("a", 0.5))}, "tenant_mix names a class twice"),
])
def test_bad_label_configs_are_one_clear_error(config: dict, message: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        WorkloadConfig(**config)
    assert message in str(exc.value)


def test_several_classes_need_a_mix_or_a_column() -> None:
    with pytest.raises(WorkloadError, match="defines 2 classes but nothing says which"):
        build_workload(WorkloadConfig(num_prompts=3, slo_classes=CLASSES))


def test_labels_reach_the_requests_table_and_survive_a_config_round_trip() -> None:
    cfg = SimConfig.from_dict({
        "model": "meta-llama/Llama-3.1-8B",
        "workload": {"dataset_name": "random", "num_prompts": 40, "request_rate": 20,
                     "random_input_len": 100, "random_output_len": 10,
                     "tenant_mix": [["a", 0.5], ["b", 0.5]], "slo_classes": [list(CLASSES[0])]},
    })
    assert SimConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    from reports.tables import build_tables

    res = run_simulation(cfg)
    req = build_tables(res.event_log).requests
    w = res.workload
    assert list(req["tenant"].astype(str)) == [w.tenant(int(i)) for i in req["req_id"]]
    assert set(req["slo_class"].astype(str)) == {"chat"}
