"""Frozen, validated configuration of the engine core.

Each component gets one frozen dataclass whose fields carry vLLM 0.33.0's names and defaults
(SCHEDULER_SPEC.md §1). Every config validates itself in ``__post_init__`` and raises a
``ConfigError`` (a ``ValueError``) that names the offending knob; nothing is mutated after
construction. The CLI and experiment files are built from these same fields, and
``from_dict`` rejects unknown keys with the list of valid ones.

``EngineKnobs`` is what a user sets, the same type in both worlds; its ``resolve`` (or
``scheduler_config`` then ``cache_config``, when the KV block count is known only once the
scheduler's budgets are) turns it into the ``EngineConfig`` the core runs with, given what
each world derives itself: ``max_model_len``, the KV block count, and the deployment's default
budgets (``BudgetDefaults``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeGuard, TypeVar

from engine.core.errors import UserError
from engine.core.policy_names import check_policy_name

#: vLLM's own scheduling policies; any other is a shipped name or ``package.module:ClassName``
#: (``engine.core.policy_names``), checked in one place: ``_require_policy``.
POLICIES: tuple[str, ...] = ("fcfs", "priority")
#: A scheduling policy's options, as sorted (key, value) pairs (``normalize_policy_options``).
PolicyOptions = tuple[tuple[str, str | int | float | bool], ...]

#: vLLM's default KV block size (``CacheConfig.DEFAULT_BLOCK_SIZE``).
DEFAULT_BLOCK_SIZE = 16


class ConfigError(UserError):
    """A configuration value is invalid; the message names the knob and what is valid."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def is_int(value: object) -> TypeGuard[int]:
    """A real integer: ``True``/``False`` are not accepted where a count is meant."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float (possibly NaN or infinite), never a ``bool``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require_policy(policy: object) -> None:
    why = check_policy_name(policy)
    _require(why is None, f"policy: {why}")


def normalize_policy_options(value: object) -> PolicyOptions:
    """A policy's options as sorted (key, value) pairs, from a mapping (a TOML table) or from
    pairs (a config dict round trip); keys are strings, values finite scalars."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, tuple | list) and all(
        isinstance(p, tuple | list) and len(p) == 2 for p in value
    ):
        pairs = [(p[0], p[1]) for p in value]
    else:
        raise ConfigError(
            f"policy_options must be a table of option = value, got {value!r}"
        )
    for key, v in pairs:
        _require(isinstance(key, str) and bool(key),
                 f"policy_options: an option name must be a non-empty string, got {key!r}")
        _require(
            isinstance(v, str | bool) or (is_number(v) and math.isfinite(v)),
            f"policy_options: {key} must be a string, a finite number or true/false, got {v!r}",
        )
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    _require(not repeated, f"policy_options: {', '.join(repeated)} given twice")
    return tuple(sorted(pairs))


def _require_bools(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(isinstance(value, bool), f"{name} must be true or false, got {value!r}")


_C = TypeVar("_C")


def config_from_dict(cls: type[_C], values: dict[str, Any], *, where: str = "") -> _C:
    """Build a config dataclass from a plain dict, rejecting unknown keys by name and values
    whose type does not match the field's annotation (``check_field_types``)."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(names))
    if unknown:
        label = f" in {where}" if where else ""
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)}{label} for {cls.__name__}; "
            f"valid keys: {', '.join(names)}"
        )
    if isinstance(values.get("policy_options"), dict):  # a TOML table: {option: value}
        values = {**values, "policy_options": normalize_policy_options(values["policy_options"])}
    check_field_types(cls, values, where=where)
    return cls(**values)


#: Field metadata key: this float field accepts infinity (e.g. ``request_rate``).
INFINITE_OK = "infinite_ok"


def check_field_types(cls: type[Any], values: dict[str, Any], *, where: str = "") -> None:
    """Refuse a value that a field's annotation does not admit, naming the key and what is
    valid — before ``__post_init__`` compares it with numbers (a string or ``null`` there
    would be a ``TypeError``, a NaN or infinite cost a run that never ends).

    Integers exclude ``bool``; floats take ints but never NaN, and infinity only where the
    field's metadata says ``INFINITE_OK``; nested config dataclasses are left to their own
    ``from_dict``; annotations this does not know are left to ``__post_init__``.
    """
    hints = typing.get_type_hints(cls)
    label = f"{where} " if where else ""
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value, hint = values[f.name], hints[f.name]
        if not _matches(value, hint, bool(f.metadata.get(INFINITE_OK))):
            raise ConfigError(
                f"{label}{f.name} must be {_describe(hint, bool(f.metadata.get(INFINITE_OK)))}, "
                f"got {value!r}"
            )


def _matches(value: object, hint: Any, inf_ok: bool) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a, inf_ok) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0], inf_ok) for v in value)
        return len(value) == len(args) and all(
            _matches(v, a, inf_ok) for v, a in zip(value, args, strict=True)
        )
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return is_int(value)
    if hint is float:
        return is_number(value) and (math.isfinite(value) or (inf_ok and math.isinf(value)))
    if hint is str:
        return isinstance(value, str)
    return True  # a nested config or an annotation checked by __post_init__


def _describe(hint: Any, inf_ok: bool) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a, inf_ok) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0], inf_ok)}"
        return "[" + ", ".join(_describe(a, inf_ok) for a in args) + "]"
    names = {
        type(None): "null",
        bool: "true or false",
        int: "an integer",
        float: "a number (or inf)" if inf_ok else "a finite number",
        str: "a string",
    }
    return names.get(hint, str(hint))


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What the scheduler may put into one engine step (vLLM's ``SchedulerConfig``).

    Invariants: ``max_num_batched_tokens >= max_num_seqs``; with chunked prefill off the token
    budget must hold a whole ``max_model_len`` sequence; the long-prefill threshold never
    exceeds ``max_model_len``.
    """

    max_num_batched_tokens: int = 2048  # token budget of one step (class default; see §1)
    max_num_seqs: int = 128  # most requests in RUNNING at once
    max_model_len: int = 8192  # longest sequence (prompt + outputs) the model accepts
    enable_chunked_prefill: bool = True  # split long prompts across steps
    long_prefill_token_threshold: int = 0  # cap per-step tokens of one prefill; 0 = off
    policy: str = "fcfs"  # "fcfs", "priority" (smaller first), a shipped name or module:Class
    policy_options: PolicyOptions = ()  # the policy's own options (engine/core/policy.py)
    scheduler_reserve_full_isl: bool = True  # admit only if the whole sequence's KV fits
    async_scheduling: bool = False  # two batches in flight (the engine's batch queue)
    max_num_scheduled_tokens: int | None = None  # None = max_num_batched_tokens

    def __post_init__(self) -> None:
        _require(
            is_int(self.max_num_batched_tokens) and self.max_num_batched_tokens > 0,
            f"max_num_batched_tokens must be a positive integer, got "
            f"{self.max_num_batched_tokens!r}",
        )
        _require(
            is_int(self.max_num_seqs) and self.max_num_seqs > 0,
            f"max_num_seqs must be a positive integer, got {self.max_num_seqs!r}",
        )
        _require(
            is_int(self.max_model_len) and self.max_model_len > 1,
            f"max_model_len must be an integer > 1, got {self.max_model_len!r}",
        )
        _require(
            self.max_num_batched_tokens >= self.max_num_seqs,
            f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than or "
            f"equal to max_num_seqs ({self.max_num_seqs})",
        )
        _require(
            self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
            f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({self.max_model_len}) with enable_chunked_prefill off: no prompt "
            "longer than the budget could ever run; raise max_num_batched_tokens or enable "
            "chunked prefill",
        )
        _require(
            is_int(self.long_prefill_token_threshold)
            and 0 <= self.long_prefill_token_threshold <= self.max_model_len,
            f"long_prefill_token_threshold must be in [0, max_model_len={self.max_model_len}], "
            f"got {self.long_prefill_token_threshold!r}",
        )
        _require_policy(self.policy)
        object.__setattr__(self, "policy_options", normalize_policy_options(self.policy_options))
        _require_bools(
            self, ("enable_chunked_prefill", "scheduler_reserve_full_isl", "async_scheduling")
        )
        if self.max_num_scheduled_tokens is not None:
            _require(
                is_int(self.max_num_scheduled_tokens)
                and 0 < self.max_num_scheduled_tokens <= self.max_num_batched_tokens,
                f"max_num_scheduled_tokens must be in [1, max_num_batched_tokens="
                f"{self.max_num_batched_tokens}], got {self.max_num_scheduled_tokens!r}",
            )

    @property
    def token_budget(self) -> int:
        """The per-step token budget the scheduler actually uses."""
        return self.max_num_scheduled_tokens or self.max_num_batched_tokens

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Self:
        return config_from_dict(cls, values)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The paged KV cache seen by the scheduler (vLLM's ``CacheConfig`` + block count).

    ``num_gpu_blocks`` includes the reserved null block 0, so ``num_gpu_blocks - 1`` blocks are
    usable. ``watermark`` is a fraction of ``num_gpu_blocks`` kept free when admitting.
    """

    num_gpu_blocks: int = 1000  # total blocks incl. the null block 0
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per block
    enable_prefix_caching: bool = True  # automatic prefix caching (hash-chained full blocks)
    watermark: float = 0.0  # fraction of blocks kept free for waiting admissions

    def __post_init__(self) -> None:
        _require(
            is_int(self.block_size) and self.block_size > 0,
            f"block_size must be a positive integer, got {self.block_size!r}",
        )
        _require(
            is_int(self.num_gpu_blocks) and self.num_gpu_blocks >= 2,
            f"num_gpu_blocks must be an integer >= 2 (block 0 is the reserved null block), "
            f"got {self.num_gpu_blocks!r}",
        )
        _require(
            is_number(self.watermark) and 0.0 <= self.watermark < 1.0,
            f"watermark must be a number in [0, 1), got {self.watermark!r}",
        )
        _require_bools(self, ("enable_prefix_caching",))

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: everything but the null block."""
        return self.num_gpu_blocks - 1

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_gpu_blocks)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Self:
        return config_from_dict(cls, values)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything an ``EngineCore`` needs: scheduling knobs, the KV cache it manages and the
    pipeline depth of the executor behind it.

    Invariant (vLLM 0.33's V1 model runner): async scheduling and pipeline parallelism exclude
    each other — with ``pipeline_parallel_size > 1`` the scheduler is synchronous and the batch
    queue holds one batch per stage (``max_concurrent_batches``).
    """

    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    pipeline_parallel_size: int = 1  # pipeline stages of the executor (batches in flight)

    def __post_init__(self) -> None:
        pp = self.pipeline_parallel_size
        _require(is_int(pp) and pp >= 1,
                 f"pipeline_parallel_size must be a positive integer, got {pp!r}")
        _require(
            pp == 1 or not self.scheduler.async_scheduling,
            "async scheduling is not supported with pipeline parallelism (vLLM 0.33's V1 "
            "model runner refuses it too); turn async scheduling off",
        )

    @property
    def max_concurrent_batches(self) -> int:
        """The size of the engine's batch queue, as vLLM's ``VllmConfig.max_concurrent_batches``:
        one batch per pipeline stage, 2 under async scheduling, else 1."""
        if self.pipeline_parallel_size > 1:
            return self.pipeline_parallel_size
        return 2 if self.scheduler.async_scheduling else 1


@dataclass(frozen=True, slots=True)
class BudgetDefaults:
    """The per-step budgets a deployment takes when the user leaves them unset: vLLM picks them
    by device and entry point (the offline ``LLM`` class or the online server, SCHEDULER_SPEC.md
    §1)."""

    max_num_batched_tokens: int  # token budget of one step
    max_num_seqs: int  # most running requests


#: vLLM's class defaults (``SchedulerConfig``'s own), used by the offline real engine.
CLASS_DEFAULT_BUDGETS = BudgetDefaults(max_num_batched_tokens=2048, max_num_seqs=128)


@dataclass(frozen=True, slots=True)
class EngineKnobs:
    """vLLM's engine knobs as a user sets them, in either world; None = the deployment's default.

    Invariants: budgets, when given, are positive integers; the policy names one
    (``engine.core.policy.check_policy_name``) and its options are scalars;
    the block size and watermark are valid for a ``CacheConfig``. Everything that depends on
    the model or the memory (``max_model_len``, the KV block count) is resolved elsewhere and
    passed to ``resolve``, where the full ``SchedulerConfig`` validation runs.
    """

    max_num_batched_tokens: int | None = None  # None: the deployment's default (BudgetDefaults)
    max_num_seqs: int | None = None  # None: min(the deployment's default, the token budget)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"  # "fcfs", "priority", a shipped policy or package.module:ClassName
    policy_options: PolicyOptions = ()  # the policy's options ({name: value} in files)
    scheduler_reserve_full_isl: bool = True
    async_scheduling: bool = True  # vLLM 0.33.0's online default; two batches in flight
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    watermark: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            _require(v is None or (is_int(v) and v >= 1),
                     f"{name} must be a positive integer, got {v!r}")
        _require_policy(self.policy)
        object.__setattr__(self, "policy_options", normalize_policy_options(self.policy_options))
        CacheConfig(block_size=self.block_size, watermark=self.watermark)  # validates

    def budgets(self, defaults: BudgetDefaults) -> BudgetDefaults:
        """The budgets given, each one left unset taken from ``defaults``."""
        return BudgetDefaults(
            max_num_batched_tokens=self.max_num_batched_tokens or defaults.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs or defaults.max_num_seqs,
        )

    def scheduler_config(self, max_model_len: int, defaults: BudgetDefaults) -> SchedulerConfig:
        """The scheduler's config for sequences of up to ``max_model_len`` tokens. Without
        chunked prefill the token budget is raised to ``max_model_len`` (a prompt must fit in
        one step); an unset ``max_num_seqs`` never exceeds the token budget."""
        budgets = self.budgets(defaults)
        budget = budgets.max_num_batched_tokens
        if not self.enable_chunked_prefill:
            budget = max(budget, max_model_len)
        max_num_seqs = budgets.max_num_seqs
        if self.max_num_seqs is None:
            max_num_seqs = min(max_num_seqs, budget)
        return SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.policy,
            policy_options=self.policy_options,
            scheduler_reserve_full_isl=self.scheduler_reserve_full_isl,
            async_scheduling=self.async_scheduling,
        )

    def cache_config(self, num_gpu_blocks: int) -> CacheConfig:
        """The KV cache's config with ``num_gpu_blocks`` blocks (the null block included)."""
        return CacheConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            watermark=self.watermark,
        )

    def resolve(
        self, *, max_model_len: int, num_gpu_blocks: int, defaults: BudgetDefaults
    ) -> EngineConfig:
        """The ``EngineConfig`` the core runs with (see ``scheduler_config``)."""
        return EngineConfig(
            scheduler=self.scheduler_config(max_model_len, defaults),
            cache=self.cache_config(num_gpu_blocks),
        )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Self:
        return config_from_dict(cls, values)
