"""Workloads: when requests are sent, how long their prompts and outputs are, what they share.

A ``Workload`` is columnar (numpy arrays, one entry per request, in send order) so a million
requests cost tens of megabytes, not gigabytes. It is a pure function of a frozen
``WorkloadConfig`` and its seed.

Datasets (names and flags mirror ``vllm bench serve``):

* ``random`` — lengths uniform in ``[len·(1−r), len·(1+r)]`` (``--random-input-len``,
  ``--random-output-len``, ``--random-range-ratio``), an optional prefix shared by every
  request (``--random-prefix-len``); drawn with ``numpy.random.default_rng(seed)`` as vllm bench
  does.
* ``prefix_repetition`` — ``num_prefixes`` distinct prefixes, ``num_prompts // num_prefixes``
  requests each (prefix + unique suffix), shuffled with the seed.
* ``trace`` — a file: a request-stream CSV ``arrived_at, num_prefill_tokens, num_decode_tokens``
  (Vidur's format, seconds), an Azure LLM 2023 CSV ``TIMESTAMP, ContextTokens,
  GeneratedTokens``, or a Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids`` — one id per 512-token block, equal ids = shared prefix, used for prefix caching).
  The file's own arrival times are replayed (optionally sped up by ``trace_time_scale``) unless
  a ``request_rate`` is given, in which case the trace only supplies lengths (sampled with the
  seed) and arrivals are synthetic.

Arrivals (synthetic): gaps ~ Gamma(shape=burstiness, scale=1/(rate·burstiness)) drawn with
numpy's legacy ``RandomState(seed)`` (what ``np.random.seed(seed); np.random.gamma`` gives in
vllm bench), cumulated and rescaled so the last request is sent at exactly N/rate; rate
``inf`` sends everything at t=0.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from engine.core.config import INFINITE_OK
from workload.traces import MOONCAKE_BLOCK_TOKENS, TRACES, WorkloadError, load_trace

DatasetName = Literal["random", "prefix_repetition", "trace"]
#: Bounds beyond which a workload cannot be held (numpy int64 lengths; memory per request).
MAX_PROMPTS = 100_000_000
MAX_TOKENS = 2**40
MAX_SPAN_S = 1e15  # longest arrival span a float64 clock still resolves to ~0.1 s


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Everything that determines a workload (with ``seed``, a pure function of this)."""

    dataset_name: DatasetName = "random"
    num_prompts: int = 1000
    request_rate: float = field(  # requests/s; inf = all at t=0 (trace: None = file times)
        default=math.inf, metadata={INFINITE_OK: True}
    )
    burstiness: float = field(  # gamma shape; 1 = Poisson, inf = evenly spaced
        default=1.0, metadata={INFINITE_OK: True}
    )
    max_concurrency: int | None = None  # client-side cap on requests in flight
    seed: int = 0
    # random
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    # prefix_repetition
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    # trace
    dataset_path: str | None = None  # a file, or a built-in trace name (see TRACES)
    trace_time_scale: float = 1.0  # >1 replays the trace faster (arrival times divided by it)
    trace_rate_given: bool = False  # True: use request_rate for arrivals, trace for lengths
    # request classes: ((priority, fraction), ...); empty = everyone priority 0
    priority_mix: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise WorkloadError(msg)

        if self.dataset_name not in ("random", "prefix_repetition", "trace"):
            bad(
                f"unknown dataset {self.dataset_name!r}; valid: random, prefix_repetition, trace"
            )
        if self.num_prompts < 1:
            bad(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.num_prompts > MAX_PROMPTS:
            bad(
                f"num_prompts must be <= {MAX_PROMPTS:,} (a run keeps per-request records: "
                f"≈ 1.7 GB peak per million requests), got {self.num_prompts}"
            )
        for name in ("random_input_len", "random_output_len", "random_prefix_len",
                     "prefix_repetition_prefix_len", "prefix_repetition_suffix_len",
                     "prefix_repetition_output_len"):
            if getattr(self, name) > MAX_TOKENS:
                bad(f"{name} must be <= {MAX_TOKENS:,} tokens, got {getattr(self, name)}")
        if not self.request_rate > 0:
            bad(f"request_rate must be > 0 (or inf), got {self.request_rate}")
        if not self.burstiness > 0:
            bad(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            bad(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.random_input_len < 1 or self.random_output_len < 1:
            bad("random_input_len and random_output_len must be >= 1")
        if not 0.0 <= self.random_range_ratio < 1.0:
            bad(f"random_range_ratio must be in [0, 1), got {self.random_range_ratio}")
        if self.random_prefix_len < 0:
            bad("random_prefix_len must be >= 0")
        if self.seed < 0:
            bad(f"seed must be >= 0, got {self.seed}")
        if self.prefix_repetition_prefix_len < 0 or self.prefix_repetition_suffix_len < 0:
            bad(
                "prefix_repetition_prefix_len and prefix_repetition_suffix_len must be >= 0, "
                f"got {self.prefix_repetition_prefix_len} and {self.prefix_repetition_suffix_len}"
            )
        if self.prefix_repetition_num_prefixes < 1:
            bad("prefix_repetition_num_prefixes must be >= 1")
        if self.dataset_name == "prefix_repetition" and (
            self.num_prompts < self.prefix_repetition_num_prefixes
        ):
            bad(
                f"num_prompts ({self.num_prompts}) must be >= prefix_repetition_num_prefixes "
                f"({self.prefix_repetition_num_prefixes})"
            )
        if self.dataset_name == "prefix_repetition" and (
            self.prefix_repetition_prefix_len + self.prefix_repetition_suffix_len < 1
            or self.prefix_repetition_output_len < 1
        ):
            bad("prefix_repetition lengths must give prompts and outputs of >= 1 token")
        if self.dataset_name != "trace" and self.dataset_path:
            bad(
                f"dataset_path is only used with dataset 'trace' "
                f"(dataset is {self.dataset_name!r})"
            )
        if self.dataset_name == "trace" and not self.dataset_path:
            bad(f"dataset 'trace' needs dataset_path (a file or one of {', '.join(TRACES)})")
        if not self.trace_time_scale > 0:
            bad(f"trace_time_scale must be > 0, got {self.trace_time_scale}")
        if self.priority_mix:
            total = sum(f for _, f in self.priority_mix)
            if any(f < 0 for _, f in self.priority_mix) or not math.isclose(total, 1.0):
                bad(f"priority_mix fractions must be >= 0 and sum to 1, got {self.priority_mix}")


@dataclass(frozen=True, slots=True)
class Workload:
    """A request stream in send order (all arrays have one entry per request)."""

    send_time_s: np.ndarray  # float64, nondecreasing, first may be > 0
    prompt_lens: np.ndarray  # int64, >= 1
    output_lens: np.ndarray  # int64, >= 1 (requests stop there, as with ignore_eos)
    priorities: np.ndarray  # int64
    shared_prefix_ids: np.ndarray  # int64, -1 = no shared prefix
    shared_prefix_lens: np.ndarray  # int64, tokens of the shared prefix
    max_concurrency: int | None
    source: str  # provenance for reports (dataset, file, licence note)
    # Mooncake-style prefix identities: per request, one id per ``hash_block_tokens`` tokens.
    hash_ids: list[tuple[int, ...]] | None = None
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    request_rate: float = math.inf
    burstiness: float = 1.0
    extra: dict[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def prompt_block_keys(self, index: int, block_size: int) -> Sequence[Hashable]:
        """Prefix identity of each full prompt block of request ``index`` that it may share.

        Blocks not listed (past the shared part) are unique to the request.
        """
        n_full = int(self.prompt_lens[index]) // block_size
        if self.hash_ids is not None:
            ids = self.hash_ids[index]
            hb = self.hash_block_tokens
            keys = []
            for i in range(n_full):
                j = ((i + 1) * block_size - 1) // hb
                if j >= len(ids):
                    break
                keys.append(("mc", ids[j], i))
            return keys
        pid = int(self.shared_prefix_ids[index])
        if pid < 0:
            return ()
        n_shared = min(int(self.shared_prefix_lens[index]) // block_size, n_full)
        return [("pfx", pid, i) for i in range(n_shared)]


# -- arrivals ------------------------------------------------------------------------------------
def synthetic_send_times(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """vllm bench serve's arrival process (see module docstring)."""
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.RandomState(seed).gamma(
            shape=burstiness, scale=1.0 / (rate * burstiness), size=n
        )
    times = np.cumsum(gaps)
    if times[-1] != 0:
        times *= (n / rate) / times[-1]
    return times


# -- builders ------------------------------------------------------------------------------------
def build_workload(cfg: WorkloadConfig) -> Workload:
    """The workload ``cfg`` describes (deterministic in ``cfg.seed``)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if cfg.dataset_name == "random":
            w = _random(cfg)
        elif cfg.dataset_name == "prefix_repetition":
            w = _prefix_repetition(cfg)
        else:
            w = _trace(cfg)
    send = w.send_time_s
    if len(send) and not (np.isfinite(send).all() and float(send.max()) <= MAX_SPAN_S):
        raise WorkloadError(
            f"the arrival times overflow or span more than {MAX_SPAN_S:g} s (last send at "
            f"{float(send[-1])} s): "
            f"request_rate ({cfg.request_rate}) or trace_time_scale ({cfg.trace_time_scale}) "
            "is too small"
        )
    if cfg.priority_mix:
        rng = np.random.default_rng(cfg.seed + 7919)
        prios = np.array([p for p, _ in cfg.priority_mix], dtype=np.int64)
        fracs = np.array([f for _, f in cfg.priority_mix], dtype=np.float64)
        w = _replace(w, priorities=prios[rng.choice(len(prios), size=len(w), p=fracs)])
    return w


def _replace(w: Workload, **changes: object) -> Workload:
    fields_ = {name: getattr(w, name) for name in Workload.__dataclass_fields__}
    fields_.update(changes)
    return Workload(**fields_)


def _uniform_lengths(
    rng: np.random.Generator, n: int, mean: int, ratio: float
) -> np.ndarray:
    low = max(1, math.floor(mean * (1 - ratio)))
    high = max(low, math.ceil(mean * (1 + ratio)))
    return rng.integers(low, high + 1, size=n).astype(np.int64)


def _random(cfg: WorkloadConfig) -> Workload:
    n = cfg.num_prompts
    rng = np.random.default_rng(cfg.seed)
    input_lens = _uniform_lengths(rng, n, cfg.random_input_len, cfg.random_range_ratio)
    output_lens = _uniform_lengths(rng, n, cfg.random_output_len, cfg.random_range_ratio)
    prefix = cfg.random_prefix_len
    return Workload(
        send_time_s=synthetic_send_times(n, cfg.request_rate, cfg.burstiness, cfg.seed),
        prompt_lens=input_lens + prefix,
        output_lens=output_lens,
        priorities=np.zeros(n, dtype=np.int64),
        shared_prefix_ids=np.full(n, 0 if prefix else -1, dtype=np.int64),
        shared_prefix_lens=np.full(n, prefix, dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=(
            f"random: input {cfg.random_input_len}, output {cfg.random_output_len}, range ratio "
            f"{cfg.random_range_ratio}, shared prefix {prefix}"
        ),
        request_rate=cfg.request_rate,
        burstiness=cfg.burstiness,
    )


def _prefix_repetition(cfg: WorkloadConfig) -> Workload:
    per_prefix = cfg.num_prompts // cfg.prefix_repetition_num_prefixes
    n = per_prefix * cfg.prefix_repetition_num_prefixes
    ids = np.repeat(np.arange(cfg.prefix_repetition_num_prefixes, dtype=np.int64), per_prefix)
    np.random.default_rng(cfg.seed).shuffle(ids)
    prompt = cfg.prefix_repetition_prefix_len + cfg.prefix_repetition_suffix_len
    return Workload(
        send_time_s=synthetic_send_times(n, cfg.request_rate, cfg.burstiness, cfg.seed),
        prompt_lens=np.full(n, prompt, dtype=np.int64),
        output_lens=np.full(n, cfg.prefix_repetition_output_len, dtype=np.int64),
        priorities=np.zeros(n, dtype=np.int64),
        shared_prefix_ids=ids,
        shared_prefix_lens=np.full(n, cfg.prefix_repetition_prefix_len, dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=(
            f"prefix_repetition: {cfg.prefix_repetition_num_prefixes} prefixes of "
            f"{cfg.prefix_repetition_prefix_len} tokens, suffix "
            f"{cfg.prefix_repetition_suffix_len}, output {cfg.prefix_repetition_output_len}"
        ),
        request_rate=cfg.request_rate,
        burstiness=cfg.burstiness,
    )


def _trace(cfg: WorkloadConfig) -> Workload:
    assert cfg.dataset_path is not None
    rows = load_trace(cfg.dataset_path)
    total = len(rows.prompt_lens)
    n = cfg.num_prompts
    if cfg.trace_rate_given:
        rng = np.random.default_rng(cfg.seed)
        idx = rng.choice(total, size=n, replace=n > total)
        send = synthetic_send_times(n, cfg.request_rate, cfg.burstiness, cfg.seed)
        timing = f"synthetic arrivals at {cfg.request_rate} req/s"
    else:
        n = min(n, total)
        idx = np.arange(n)
        send = (rows.arrival_s[:n] - rows.arrival_s[0]) / cfg.trace_time_scale
        timing = "the trace's own arrival times" + (
            f" sped up {cfg.trace_time_scale}x" if cfg.trace_time_scale != 1 else ""
        )
    hash_ids = [rows.hash_ids[i] for i in idx] if rows.hash_ids is not None else None
    return Workload(
        send_time_s=send,
        prompt_lens=rows.prompt_lens[idx],
        output_lens=rows.output_lens[idx],
        priorities=np.zeros(len(idx), dtype=np.int64),
        shared_prefix_ids=np.full(len(idx), -1, dtype=np.int64),
        shared_prefix_lens=np.zeros(len(idx), dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=f"{rows.kind} trace {cfg.dataset_path} ({len(idx)} of {total} requests, {timing})",
        hash_ids=hash_ids,
        request_rate=cfg.request_rate if cfg.trace_rate_given else math.nan,
        burstiness=cfg.burstiness,
    )
