"""Workloads: vllm bench serve's arrival process and datasets, and trace loading."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workload.arrivals import synthetic_send_times
from workload.build import build_workload
from workload.config import WorkloadConfig
from workload.errors import WorkloadError
from workload.stream import Workload
from workload.traces import load_trace


def test_poisson_arrivals_rescaled_to_end_at_n_over_rate() -> None:
    t = synthetic_send_times(1000, 4.0, 1.0, seed=0)
    assert t[-1] == pytest.approx(250.0)
    assert (np.diff(t) >= 0).all()
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.25, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.15)  # exponential: cv = 1


def test_burstiness_is_the_gamma_shape() -> None:
    smooth = np.diff(synthetic_send_times(4000, 10.0, 4.0, seed=1))
    bursty = np.diff(synthetic_send_times(4000, 10.0, 0.25, seed=1))
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.1)  # cv = 1/sqrt(k)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)


def test_arrivals_match_vllm_bench_draws() -> None:
    # vllm bench: np.random.seed(seed); gamma draws; cumsum; rescale to n/rate
    n, rate, k, seed = 50, 2.0, 1.0, 42
    np.random.seed(seed)
    delays = np.cumsum([np.random.gamma(shape=k, scale=1 / (rate * k)) for _ in range(n)])
    expected = delays * (n / rate) / delays[-1]
    assert np.allclose(synthetic_send_times(n, rate, k, seed), expected, rtol=0, atol=1e-12)


def test_infinite_rate_sends_everything_at_zero() -> None:
    assert (synthetic_send_times(5, math.inf, 1.0, 0) == 0).all()


def test_random_dataset_lengths() -> None:
    w = build_workload(WorkloadConfig(dataset_name="random", num_prompts=2000, random_input_len=100,
                                      random_output_len=10, random_range_ratio=0.5,
                                      random_prefix_len=32))
    assert w.prompt_lens.min() >= 50 + 32 and w.prompt_lens.max() <= 150 + 32
    assert w.output_lens.min() >= 5 and w.output_lens.max() <= 15
    keys = w.prompt_block_keys(3, 16)  # floor(32 / 16) shared blocks, the same for all
    assert len(keys) == 2 and keys == w.prompt_block_keys(4, 16)
    assert all(type(k) is int and k >= 0 for k in keys)  # PrecomputedBlockHasher's rule


def test_prefix_repetition_shares_prefix_blocks() -> None:
    w = build_workload(WorkloadConfig(dataset_name="prefix_repetition", num_prompts=20,
                                      prefix_repetition_prefix_len=40,
                                      prefix_repetition_num_prefixes=4))
    assert len(w) == 20 and sorted(np.bincount(w.shared_prefix_ids)) == [5, 5, 5, 5]
    keys = [tuple(w.prompt_block_keys(i, 16)) for i in range(20)]
    assert all(len(k) == 2 for k in keys)  # floor(40 / 16) shared blocks
    assert len(set(keys)) == 4


@pytest.mark.parametrize("config, shares", [
    (WorkloadConfig(dataset_name="random", num_prompts=20), False),
    (WorkloadConfig(dataset_name="trace", dataset_path="azure-conv", num_prompts=50), False),
    (WorkloadConfig(dataset_name="random", num_prompts=20, random_prefix_len=32), True),
    (WorkloadConfig(dataset_name="trace", dataset_path="mooncake-conversation", num_prompts=20),
     True),
])
def test_has_prompt_block_keys_says_whether_any_request_has_one(
    config: WorkloadConfig, shares: bool
) -> None:
    """The simulator skips ``prompt_block_keys`` for a workload that has none to give."""
    w = build_workload(config)
    assert w.has_prompt_block_keys() is shares
    assert any(len(w.prompt_block_keys(i, 16)) for i in range(len(w))) is shares


def test_azure_and_mooncake_traces_load() -> None:
    az = load_trace("azure-conv")
    assert len(az.prompt_lens) == 19366 and az.arrival_s[0] == 0
    assert (np.diff(az.arrival_s) >= 0).all()
    mc = build_workload(WorkloadConfig(dataset_name="trace", dataset_path="mooncake-conversation",
                                       num_prompts=50))
    assert mc.hash_ids is not None and len(mc) == 50
    # requests 0 and 1 share their first 512-token block (hash id 0): 32 blocks of 16
    k0, k1 = mc.prompt_block_keys(0, 16), mc.prompt_block_keys(1, 16)
    assert k0[:32] == k1[:32] and k0[32] != k1[32]


def _trace_workload(hash_ids: list[tuple[int, ...]], prompt_lens: list[int],
                    hash_block_tokens: int) -> Workload:
    n = len(prompt_lens)
    ones = np.ones(n, dtype=np.int64)
    return Workload(send_time_s=np.zeros(n), prompt_lens=np.array(prompt_lens, dtype=np.int64),
                    output_lens=ones, priorities=0 * ones, shared_prefix_ids=-ones,
                    shared_prefix_lens=0 * ones, max_concurrency=None, source="test",
                    hash_ids=hash_ids, hash_block_tokens=hash_block_tokens)


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.lists(st.integers(-3, 3), max_size=6).map(tuple), min_size=2, max_size=3),
    hash_block_tokens=st.sampled_from([4, 6, 8, 12, 32]),
    block_size=st.sampled_from([1, 2, 3, 4, 8]),
    extra_tokens=st.lists(st.integers(-20, 20), min_size=3, max_size=3),
)
def test_trace_block_keys_identify_hash_id_and_block(
    ids: list[tuple[int, ...]], hash_block_tokens: int, block_size: int, extra_tokens: list[int]
) -> None:
    """Block i of a trace request is known by the hash id of the hash block holding its last
    token, and i; blocks past the listed ids are the request's own. The keys (non-negative
    ints) are equal across requests exactly when those are, on both paths (hash blocks a
    multiple of the block size, or not)."""
    lens = [max(1, len(h) * hash_block_tokens + x) for h, x in zip(ids, extra_tokens,
                                                                    strict=False)]
    w = _trace_workload(ids, lens, hash_block_tokens)

    def identity(r: int) -> list[tuple[int, int]]:  # the rule, spelled out
        out = []
        for i in range(lens[r] // block_size):
            j = ((i + 1) * block_size - 1) // hash_block_tokens
            if j >= len(ids[r]):
                break
            out.append((ids[r][j], i))
        return out

    keys = [list(w.prompt_block_keys(r, block_size)) for r in range(len(ids))]
    names = [identity(r) for r in range(len(ids))]
    assert [len(k) for k in keys] == [len(n) for n in names]
    assert all(type(k) is int and k >= 0 for ks in keys for k in ks)
    flat_keys = [k for ks in keys for k in ks]
    flat_names = [n for ns in names for n in ns]
    for a in range(len(flat_keys)):
        for b in range(len(flat_keys)):
            assert (flat_keys[a] == flat_keys[b]) == (flat_names[a] == flat_names[b])


def test_request_stream_csv_and_time_scale(tmp_path: Path) -> None:
    f = tmp_path / "s.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,10,2\n3.0,20,4\n")
    w = build_workload(WorkloadConfig(dataset_name="trace", dataset_path=str(f), num_prompts=10,
                                      trace_time_scale=2.0))
    assert list(w.send_time_s) == [0.0, 1.0] and list(w.prompt_lens) == [10, 20]


def test_trace_lengths_with_synthetic_arrivals(tmp_path: Path) -> None:
    w = build_workload(WorkloadConfig(dataset_name="trace", dataset_path="azure-code",
                                      num_prompts=100, request_rate=5.0, trace_rate_given=True))
    assert w.send_time_s[-1] == pytest.approx(20.0) and len(w) == 100


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("arrived_at,num_prefill_tokens\n1,2\n", "missing column.*num_decode_tokens"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n", "missing column.*GeneratedTokens"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,x,2\n", "non-number"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n", "no requests"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,0,2\n", "fewer than 1 token"),
        # wrong columns are named even when the file has no rows
        ("a,b\n", "missing column.*arrived_at.*found a, b"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,2,3\n2,5\n",
         r"bad\.csv:3: row has 2 field\(s\), the header 3"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\nnan,2,3\n",
         "request 0 has an arrival time that is not a finite number"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,2,3\ninf,2,3\n",
         "request 1 has an arrival time that is not a finite number"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,inf,2\n",
         r"num_prefill_tokens holds a non-finite or too large number \(inf, request 0\)"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,2,nan\n",
         r"num_decode_tokens holds a non-finite or too large number \(nan, request 0\)"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+00:00,3,4\n"
         "2023-11-16 18:15:47,3,4\n", "TIMESTAMP mixes times with and without a UTC offset"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens,arrived_at\n1,5,3,2\n",
         r"column\(s\) arrived_at appear twice"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,5.7,3\n",
         r"num_prefill_tokens holds a token count that is not a whole number \(5.7, request 0\)"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,2,3\n1,1e30,3\n",
         r"num_prefill_tokens holds a non-finite or too large number \(1e\+30, request 1\)"),
    ],
)
def test_bad_trace_files(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(content)
    with pytest.raises(WorkloadError, match=match):
        load_trace(str(f))


def test_a_directory_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="is a directory, not a file"):
        load_trace(str(tmp_path))


def test_binary_mooncake_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(WorkloadError, match=r"trace file .*bad\.jsonl is not UTF-8 text"):
        load_trace(str(f))


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"timestamp": 0, "input_length": 10}', r"bad\.jsonl:1: Mooncake rows need"),
        ('{"timestamp": 0, "input_length": 1e999, "output_length": 5}',
         r"bad\.jsonl:1: Mooncake rows need.*whole numbers, got \(inf, 5\)"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 100000000000000000000}',
         r"bad\.jsonl:1: Mooncake rows need.*length out of range"),
        ('{"timestamp": 0, "input_length": true, "output_length": 5}',
         r"lengths must be whole numbers, got \(True, 5\)"),
        ('{"timestamp": 0, "input_length": 10.5, "output_length": 5}',
         r"lengths must be whole numbers, got \(10.5, 5\)"),
        ('{"timestamp": 0, "input_length": "10", "output_length": 5}',
         r"lengths must be whole numbers, got \('10', 5\)"),
        ('{"timestamp": true, "input_length": 10, "output_length": 5}',
         "timestamp must be a number, got True"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": "12"}',
         "hash_ids must be a list of integers, got '12'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1.7, true]}',
         r"hash_ids must be a list of integers, got \[1.7, True\]"),
        ('{"timestamp": NaN, "input_length": 10, "output_length": 5}',
         "request 0 has an arrival time that is not a finite number"),
    ],
)
def test_bad_mooncake_row(tmp_path: Path, line: str, match: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(WorkloadError, match=match):
        load_trace(str(f))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"request_rate": -1.0}, "request_rate must be > 0"),
        ({"burstiness": 0.0}, "burstiness must be > 0"),
        ({"num_prompts": 0}, "num_prompts must be >= 1"),
        ({"dataset_name": "burstgpt"}, "unknown dataset 'burstgpt'; valid"),
        ({"dataset_name": "sharegpt"}, "sharegpt' needs dataset_path"),
        ({"dataset_name": "trace"}, "needs dataset_path"),
        ({"dataset_name": "trace", "dataset_path": "nope.csv"}, "not found"),
        ({"random_range_ratio": 1.5}, "random_range_ratio"),
    ],
)
def test_bad_workload_configs(kwargs: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        build_workload(WorkloadConfig(**kwargs))


def test_admission_rule_refuses_what_cannot_fit_and_says_why() -> None:
    from workload.admission import exceeds_max_model_len, reject_reason

    assert not exceeds_max_model_len(30, 20, 50) and reject_reason(30, 20, 50) is None
    assert exceeds_max_model_len(31, 20, 50)
    assert reject_reason(31, 20, 50) == (
        "prompt (31) + max_tokens (20) exceeds max_model_len (50)"
    )


def test_admission_rule_on_columns_answers_as_for_each_request() -> None:
    from workload.admission import exceeds_max_model_len

    prompts = np.array([30, 31, 1, 50, 49], dtype=np.int64)
    outputs = np.array([20, 20, 49, 1, 1], dtype=np.int64)
    each = exceeds_max_model_len(prompts, outputs, 50)
    assert each.dtype == bool
    assert each.tolist() == [
        exceeds_max_model_len(int(p), int(o), 50) for p, o in zip(prompts, outputs, strict=True)
    ] == [False, True, False, True, False]
