"""``WorkloadConfig``: everything that determines a workload; with its seed, a pure function of it.

Names and defaults mirror ``vllm bench serve``'s flags (``--dataset-name``, ``--request-rate``,
``--random-input-len`` …); ``workload.build`` says what each dataset makes of them. Every value is
checked in ``__post_init__`` and a bad one is a ``WorkloadError`` naming the field.

Requests may carry a tenant and an SLO class (``engine.core.slo``): ``slo_classes`` defines the
classes (name, TTFT target ms, TPOT target ms), and each request gets its tenant and class from
the trace's ``tenant`` / ``slo_class`` columns or, for a dataset without them, drawn with the
seed from ``tenant_mix`` / ``slo_class_mix`` (one class alone needs no mix: everyone has it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from engine.core.config import INFINITE_OK
from engine.core.errors import UserError
from engine.core.slo import SLOClass
from workload.arrivals import RAMP_UP_STRATEGIES
from workload.errors import WorkloadError
from workload.traces import TRACES

DatasetName = Literal["random", "prefix_repetition", "trace", "sharegpt"]
DATASETS: tuple[str, ...] = ("random", "prefix_repetition", "trace", "sharegpt")
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
    # trace, sharegpt
    dataset_path: str | None = None  # a file, or a built-in trace name (see TRACES)
    trace_time_scale: float = 1.0  # >1 replays the trace faster (arrival times divided by it)
    trace_rate_given: bool = False  # True: use request_rate for arrivals, trace for lengths
    # sharegpt: the tokenizer that counts prompt and completion tokens, and a fixed output length
    tokenizer: str | None = None  # a directory holding tokenizer.json
    sharegpt_output_len: int | None = None  # None: the completion's own token count
    # ramp-up (vllm bench's --ramp-up-*): each request's rate moves from start to end
    ramp_up_strategy: str | None = None  # None, "linear" or "exponential"
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    # request classes: ((priority, fraction), ...); empty = everyone priority 0
    priority_mix: tuple[tuple[int, float], ...] = ()
    # tenants: ((name, fraction), ...) drawn per request; empty = the trace's column, or none
    tenant_mix: tuple[tuple[str, float], ...] = ()
    # SLO classes: ((name, ttft_ms, tpot_ms), ...); empty = requests carry no SLO
    slo_classes: tuple[tuple[str, float, float], ...] = ()
    # ((class name, fraction), ...) drawn per request; empty = the trace's column, or the one class
    slo_class_mix: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise WorkloadError(msg)

        if self.dataset_name not in DATASETS:
            bad(f"unknown dataset {self.dataset_name!r}; valid: {', '.join(DATASETS)}")
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
        if self.dataset_name not in ("trace", "sharegpt") and self.dataset_path:
            bad(
                f"dataset_path is only used with datasets 'trace' and 'sharegpt' "
                f"(dataset is {self.dataset_name!r})"
            )
        if self.dataset_name == "trace" and not self.dataset_path:
            bad(f"dataset 'trace' needs dataset_path (a file or one of {', '.join(TRACES)})")
        self._check_sharegpt(bad)
        self._check_ramp_up(bad)
        if not self.trace_time_scale > 0:
            bad(f"trace_time_scale must be > 0, got {self.trace_time_scale}")
        for name in ("priority_mix", "tenant_mix", "slo_class_mix"):
            mix = getattr(self, name)
            if mix:
                total = sum(f for _, f in mix)
                if any(f < 0 for _, f in mix) or not math.isclose(total, 1.0):
                    bad(f"{name} fractions must be >= 0 and sum to 1, got {mix}")
                labels = [label for label, _ in mix]
                if len(set(labels)) != len(labels):
                    bad(f"{name} names a class twice: {mix}")
        self.slo_class_defs()  # checks the classes
        defined = [c for c, _, _ in self.slo_classes]
        if len(set(defined)) != len(defined):
            bad(f"slo_classes defines a class twice: {', '.join(defined)}")
        undefined = [c for c, _ in self.slo_class_mix if c not in defined]
        if undefined:
            bad(
                f"slo_class_mix names class(es) {', '.join(map(repr, undefined))} that "
                f"slo_classes does not define (defined: {', '.join(defined) or 'none'})"
            )
        if any(not isinstance(t, str) or not t for t, _ in self.tenant_mix):
            bad(f"tenant_mix names must be non-empty strings, got {self.tenant_mix}")

    def slo_class_defs(self) -> tuple[SLOClass, ...]:
        """The SLO classes ``slo_classes`` defines (targets in seconds)."""
        try:
            return tuple(SLOClass.from_ms(n, t, p) for n, t, p in self.slo_classes)
        except UserError as exc:
            raise WorkloadError(f"slo_classes: {exc}") from None

    def _check_sharegpt(self, bad: Callable[[str], None]) -> None:
        if self.dataset_name == "sharegpt" and not (self.dataset_path and self.tokenizer):
            bad("dataset 'sharegpt' needs dataset_path (a ShareGPT JSON file) and tokenizer "
                "(a directory holding tokenizer.json, which counts its tokens)")
        if self.sharegpt_output_len is not None and self.sharegpt_output_len < 1:
            bad(f"sharegpt_output_len must be >= 1, got {self.sharegpt_output_len}")

    def _check_ramp_up(self, bad: Callable[[str], None]) -> None:
        """vllm bench's rules: a strategy, both rates, 0 < start <= end, no request_rate."""
        given = (self.ramp_up_start_rps, self.ramp_up_end_rps)
        if self.ramp_up_strategy is None:
            if any(v is not None for v in given):
                bad("ramp_up_start_rps and ramp_up_end_rps need ramp_up_strategy")
            return
        if self.ramp_up_strategy not in RAMP_UP_STRATEGIES:
            bad(f"unknown ramp_up_strategy {self.ramp_up_strategy!r}; valid: "
                f"{', '.join(RAMP_UP_STRATEGIES)}")
        start, end = given
        if start is None or end is None:
            bad("ramp_up_strategy needs both ramp_up_start_rps and ramp_up_end_rps")
            return
        if not (0 < start <= end < math.inf):
            bad(f"ramp-up rates need 0 < start <= end (finite), got {start} and {end}")
        if not math.isinf(self.request_rate):
            bad("with a ramp-up the rate comes from ramp_up_start_rps/ramp_up_end_rps: do not "
                "give request_rate")
