"""Every validation of the core's configs and sampling params, and the CLI's one-line errors.

Configs validate themselves in ``__post_init__`` and raise a ``ValueError`` naming the knob;
``config_from_dict`` rejects unknown keys and lists the valid ones. ``twinserve
replay-schedule`` on a malformed workload prints exactly one ``twinserve: error: …`` line on
stderr and exits 2 (driven through ``experiments.cli.main``, not a subprocess).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.core.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    SchedulerConfig,
    config_from_dict,
)
from engine.core.request import Request, SamplingParams
from experiments.cli import main

# -- SchedulerConfig / CacheConfig / SamplingParams ----------------------------------------------

INVALID_SCHEDULER = [
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_num_batched_tokens": -5}, "max_num_batched_tokens"),
    ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens"),
    ({"max_num_batched_tokens": "2048"}, "max_num_batched_tokens"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_seqs": None}, "max_num_seqs"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"max_model_len": 2.5}, "max_model_len"),
    # vLLM's own check: the budget must hold one token per sequence.
    ({"max_num_batched_tokens": 64, "max_num_seqs": 128}, "max_num_seqs"),
    (
        {"max_num_batched_tokens": 1024, "max_num_seqs": 16, "max_model_len": 2048,
         "enable_chunked_prefill": False},
        "enable_chunked_prefill",
    ),
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
    ({"long_prefill_token_threshold": 9000}, "long_prefill_token_threshold"),
    ({"long_prefill_token_threshold": 1.5}, "long_prefill_token_threshold"),
    ({"policy": "lifo"}, "policy"),
    ({"max_num_scheduled_tokens": 0}, "max_num_scheduled_tokens"),
    ({"max_num_scheduled_tokens": 4096}, "max_num_scheduled_tokens"),
]


@pytest.mark.parametrize(("kwargs", "knob"), INVALID_SCHEDULER,
                         ids=[f"{k}-{i}" for i, (_, k) in enumerate(INVALID_SCHEDULER)])
def test_scheduler_config_rejects(kwargs: dict[str, Any], knob: str) -> None:
    with pytest.raises(ValueError, match=knob) as info:
        SchedulerConfig(**kwargs)
    assert isinstance(info.value, ConfigError)


def test_budget_below_max_num_seqs_names_both_knobs() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=128)
    message = str(info.value)
    assert "max_num_batched_tokens (64)" in message and "max_num_seqs (128)" in message


INVALID_CACHE = [
    ({"block_size": 0}, "block_size"),
    ({"block_size": 16.0}, "block_size"),
    ({"num_gpu_blocks": 1}, "num_gpu_blocks"),
    ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
    ({"num_gpu_blocks": 10.5}, "num_gpu_blocks"),
    ({"watermark": 1.0}, "watermark"),
    ({"watermark": -0.01}, "watermark"),
]


@pytest.mark.parametrize(("kwargs", "knob"), INVALID_CACHE,
                         ids=[f"{k}-{i}" for i, (_, k) in enumerate(INVALID_CACHE)])
def test_cache_config_rejects(kwargs: dict[str, Any], knob: str) -> None:
    with pytest.raises(ConfigError, match=knob):
        CacheConfig(**kwargs)


INVALID_SAMPLING = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 17}, "min_tokens"),  # > max_tokens=16
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
]


@pytest.mark.parametrize(("kwargs", "knob"), INVALID_SAMPLING,
                         ids=[f"{k}-{i}" for i, (_, k) in enumerate(INVALID_SAMPLING)])
def test_sampling_params_reject(kwargs: dict[str, Any], knob: str) -> None:
    with pytest.raises(ValueError, match=knob):
        SamplingParams(**kwargs)


def test_valid_edge_values_are_accepted() -> None:
    SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=16, max_model_len=16,
                    enable_chunked_prefill=False, long_prefill_token_threshold=16,
                    max_num_scheduled_tokens=16)
    CacheConfig(num_gpu_blocks=2, block_size=1, watermark=0.0)
    SamplingParams(max_tokens=1, min_tokens=1, temperature=0.0, top_k=-1, top_p=1.0)
    assert SchedulerConfig(max_num_scheduled_tokens=100).token_budget == 100
    assert SchedulerConfig().token_budget == 2048
    assert CacheConfig(num_gpu_blocks=11, watermark=0.1).watermark_blocks == 1
    assert CacheConfig(num_gpu_blocks=11).num_usable_blocks == 10


def test_configs_are_frozen() -> None:
    config = SchedulerConfig()
    with pytest.raises(AttributeError):
        config.max_num_seqs = 4  # type: ignore[misc]
    with pytest.raises(AttributeError):
        EngineConfig().cache.block_size = 8  # type: ignore[misc]


@pytest.mark.parametrize("cls", [SchedulerConfig, CacheConfig])
def test_config_from_dict_rejects_unknown_keys_listing_valid_ones(
    cls: type[SchedulerConfig] | type[CacheConfig],
) -> None:
    with pytest.raises(ConfigError) as info:
        cls.from_dict({"bogus_knob": 1, "another": 2})
    message = str(info.value)
    assert "another, bogus_knob" in message  # sorted, all of them
    assert cls.__name__ in message
    for field in ("max_num_seqs",) if cls is SchedulerConfig else ("num_gpu_blocks",):
        assert field in message
    with pytest.raises(ConfigError, match=r"in workload\.json"):
        config_from_dict(cls, {"bogus_knob": 1}, where="workload.json")
    assert cls.from_dict({}) == cls()


def test_config_from_dict_still_validates_values() -> None:
    assert SchedulerConfig.from_dict({"max_num_seqs": 4}).max_num_seqs == 4
    with pytest.raises(ConfigError, match="max_num_seqs"):
        SchedulerConfig.from_dict({"max_num_seqs": 0})


def test_non_numeric_watermark_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="watermark"):
        CacheConfig(watermark="high")  # type: ignore[arg-type]


def test_boolean_knobs_must_be_bools() -> None:
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        CacheConfig(enable_prefix_caching="false")  # type: ignore[arg-type]


def test_integer_knobs_reject_bools() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=True)


def test_request_validation() -> None:
    params = SamplingParams()
    with pytest.raises(ValueError, match="prompt_token_ids or num_prompt_tokens"):
        Request("a", sampling_params=params)
    with pytest.raises(ValueError, match="num_prompt_tokens=3 but 2"):
        Request("a", sampling_params=params, prompt_token_ids=[1, 2], num_prompt_tokens=3)
    with pytest.raises(ValueError, match="at least one token"):
        Request("a", sampling_params=params, prompt_token_ids=[])
    with pytest.raises(ValueError, match="at least one token"):
        Request("a", sampling_params=params, num_prompt_tokens=0)


# -- the CLI: one line, exit status 2 --------------------------------------------------------------


def _run_cli(capsys: pytest.CaptureFixture[str], path: Path | str) -> tuple[int, str, str]:
    rc = main(["replay-schedule", str(path)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _write(tmp_path: Path, content: Any, name: str = "wl.json") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _assert_one_line_error(rc: int, out: str, err: str, *needles: str) -> str:
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("twinserve: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


MALFORMED = {
    "bad_json": ('{"requests": [', ["not valid JSON", "line 1"]),
    "not_an_object": ([], ["'requests' list"]),
    "no_requests": ({"config": {}}, ["'requests' list"]),
    "unknown_config_key": (
        {"config": {"max_num_seqz": 4}, "requests": []},
        ["unknown config key(s) max_num_seqz", "valid:", "max_num_seqs"],
    ),
    "invalid_config_value": (
        {"config": {"max_num_seqs": 0}, "requests": []}, ["max_num_seqs"]
    ),
    "request_without_prompt": (
        {"requests": [{"id": "a", "max_tokens": 3}]},
        ["request 'a'", "prompt_token_ids", "prompt_len"],
    ),
    "empty_prompt": ({"requests": [{"id": "a", "prompt_token_ids": []}]}, ["empty prompt"]),
    "non_integer_max_tokens": (
        {"requests": [{"id": "a", "prompt_len": 3, "max_tokens": "3"}]},
        ["request 'a'", "max_tokens must be an integer"],
    ),
    "float_max_tokens": (
        {"requests": [{"id": "a", "prompt_len": 3, "max_tokens": 2.5}]},
        ["max_tokens must be an integer"],
    ),
    "min_tokens_above_max": (
        {"requests": [{"id": "a", "prompt_len": 3, "max_tokens": 2, "min_tokens": 5}]},
        ["request 'a'", "min_tokens"],
    ),
    "non_integer_prompt_token": (
        {"requests": [{"id": "a", "prompt_token_ids": [1, "x"]}]}, ["prompt_token_ids"]
    ),
    "duplicate_ids": (
        {"requests": [{"id": "a", "prompt_len": 3}, {"id": "a", "prompt_len": 4}]},
        ["request ids must be unique"],
    ),
    "unknown_request_key": (
        {"requests": [{"id": "a", "prompt_len": 3, "colour": "red"}]},
        ["unknown key(s) colour", "valid:", "prompt_len"],
    ),
    "request_without_id": ({"requests": [{"prompt_len": 3}]}, ["requests[0]", "'id'"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_replay_schedule_malformed_workload(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    content, needles = MALFORMED[case]
    path = _write(tmp_path, content)
    _assert_one_line_error(*_run_cli(capsys, path), str(path), *needles)


def test_replay_schedule_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.json"
    _assert_one_line_error(*_run_cli(capsys, path), str(path), "does not exist")


def test_replay_schedule_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run_cli(capsys, tmp_path), str(tmp_path), "is a directory, not a file")


def test_replay_schedule_error_names_the_request_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, {"requests": [{"id": "a", "prompt_len": 3, "max_tokens": "3"}]})
    line = _assert_one_line_error(*_run_cli(capsys, path))
    assert line.count("request 'a'") == 1, line


@pytest.mark.parametrize(
    "content",
    [
        {"config": {"watermark": "high"}, "requests": []},
        {"requests": [{"id": "a", "prompt_len": 3, "arrival_time": "soon"}]},
    ],
    ids=["watermark_string", "arrival_time_string"],
)
def test_replay_schedule_wrongly_typed_values_are_one_line_errors(
    content: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, content)
    _assert_one_line_error(*_run_cli(capsys, path))


def test_replay_schedule_valid_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(
        tmp_path,
        {
            "config": {"max_num_batched_tokens": 100, "num_gpu_blocks": 1000},
            "requests": [{"id": str(i), "prompt_len": 60, "max_tokens": 3} for i in range(3)],
        },
    )
    rc, out, err = _run_cli(capsys, path)
    assert rc == 0 and err == ""
    records = [json.loads(line) for line in out.splitlines()]
    # SCHEDULER_SPEC #74, as recorded on the vLLM 0.33.0 oracle.
    assert [r["scheduled"] for r in records] == [
        {"0": 60, "1": 40}, {"0": 1, "1": 20, "2": 60}, {"0": 1, "1": 1, "2": 1},
        {"1": 1, "2": 1}, {},
    ]
    assert records[0]["new"] == {"0": 0, "1": 0}
    assert records[2]["finished"] == [["0", "length"]]
