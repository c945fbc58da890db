"""Records whose ``__init__`` is written out (so mypyc compiles it) still behave as dataclasses.

Each written ``__init__`` must take exactly the dataclass fields, in field order, with the
fields' defaults (``None`` standing for a ``default_factory``), store every argument under its
own name, and keep frozen records frozen — a field added to the class but not to its
``__init__`` fails here instead of surfacing as an AttributeError deep in a run. The checks
read the Python definitions (a compiled ``__init__`` hides its signature and type-checks its
arguments), so they are skipped against a compiled build, which compiles the same source.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from engine.compiled import loaded_compiled_modules
from engine.core.bulk.records import AppliedRun, RunTiming
from engine.core.engine_core import _InFlight
from engine.core.events import StepColumns, StepRecord
from engine.core.interfaces import StepTime
from engine.core.outputs import (
    BatchShape,
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from sim.stages import FrontendTimes

if loaded_compiled_modules():  # the imports above came from a compiled build
    pytest.skip("checks the Python definitions of the records", allow_module_level=True)

RECORDS = [
    BatchShape, NewRequestData, CachedRequestData, SchedulerOutput, ModelRunnerOutput,
    EngineCoreOutput, AppliedRun, RunTiming, _InFlight,
    FrontendTimes, StepTime, StepRecord, StepColumns,
]


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_init_takes_the_fields_in_order_with_their_defaults(cls: type) -> None:
    assert "__init__" in vars(cls), f"{cls.__name__} should write out its __init__"
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f.name
        else:
            assert p.default is inspect.Parameter.empty, f.name


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_init_stores_each_argument_under_its_name(cls: type) -> None:
    values = {f.name: object() for f in dataclasses.fields(cls)}  # distinct sentinels
    record = cls(**values)
    for name, value in values.items():
        assert getattr(record, name) is value, name
    assert record == cls(**values)
    if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        name = next(iter(values))
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, name, 1)


def test_default_factories_give_fresh_containers() -> None:
    a, b = CachedRequestData(), CachedRequestData()
    assert a == CachedRequestData([], set(), [], [], [], {})
    a.req_ids.append("x")
    assert b.req_ids == []
    out = EngineCoreOutput("r", [7])
    assert (out.finish_reason, out.stop_reason, out.finished) == (None, None, False)
    assert ModelRunnerOutput({}).execute_time_s is None


def test_frozen_records_hash_by_value() -> None:
    shape = BatchShape(3, 10, (8,), (0,), 2, 40, 30, 3)
    assert hash(shape) == hash(BatchShape(3, 10, (8,), (0,), 2, 40, 30, 3))
    assert shape.num_prefill_tokens == 8 and shape.num_prefill_reqs == 1
