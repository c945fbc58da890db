"""Experiment files: a base config, a grid of overrides, variants and seeds → validated points.

An experiment file (TOML, or JSON with the same structure) looks like::

    name = "chunked-prefill"          # optional, for titles
    [base]                            # any SimConfig dict (sections engine/frontend/workload…)
    model = "meta-llama/Llama-3.1-8B"
    [base.workload]
    dataset_name = "trace"
    dataset_path = "azure-conv"
    [grid]                            # axes: key = [values]; the points are their product
    "workload.request_rate" = [2, 4, 8]
    enable_chunked_prefill = [true, false]   # vLLM flag names work too
    seeds = [0, 1]
    [[variant]]                       # optional named groups of overrides (× the grid)
    name = "tp2"
    tensor_parallel_size = 2
    [report]                          # summary options, as vllm bench spells them
    goodput = ["ttft:500", "tpot:50"]
    percentiles = [50, 90, 99]

A key is a dotted config path (``workload.request_rate``), a top-level field
(``data_parallel_size``), a ``twinserve simulate`` flag name with ``-`` or ``_``
(``request-rate``, ``scheduling_policy``; ``experiments.simconfig.FLAG_FIELDS``) or a field name
that only one section has (``priority_mix``). ``seeds`` (in ``[grid]`` or ``[sweep]``) sets the
run's seed, which is ``workload.seed`` (set at both spellings, so older configs agree).

Invariants: every point's config is validated (``SimConfig`` + the engine/KV resolution) before
anything runs, all errors are reported at once, and an unknown key is rejected with the list of
valid ones. Points come out in a fixed order (variant, then the grid in file order, then seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from experiments.simconfig import FLAG_FIELDS, config_dict_from_args, load_experiment_file

#: Top-level tables/keys an experiment file may hold.
FILE_KEYS: tuple[str, ...] = ("name", "description", "base", "grid", "variant", "sweep", "report")
#: Keys of ``[report]`` (vllm bench's summary options).
REPORT_KEYS: tuple[str, ...] = ("goodput", "percentiles", "percentile_metrics")
#: Keys of ``[sweep]``.
SWEEP_KEYS: tuple[str, ...] = ("seeds",)
#: Summary options used when ``[report]`` leaves them out.
DEFAULT_REPORT: dict[str, Any] = {
    "goodput": {}, "percentiles": [50.0, 90.0, 99.0],
    "percentile_metrics": ["ttft", "tpot", "itl", "e2el"],
}
SEED_KEYS: frozenset[str] = frozenset({"seed", "seeds"})


class ExperimentError(UserError):
    """A malformed experiment file or an invalid point; the message lists what is valid."""


# -- key resolution ------------------------------------------------------------------------------
@cache
def _sections() -> dict[str, tuple[str, ...]]:
    from sim.config import SimConfig

    out: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(SimConfig):
        default = f.default_factory() if callable(f.default_factory) else None
        if dataclasses.is_dataclass(default):
            out[f.name] = tuple(g.name for g in dataclasses.fields(default))
    return out


@cache
def _top_level() -> tuple[str, ...]:
    from sim.config import SimConfig

    sections = _sections()
    return tuple(f.name for f in dataclasses.fields(SimConfig) if f.name not in sections)


def valid_keys() -> list[str]:
    """Every canonical key: top-level fields, then ``section.field`` for each section."""
    keys = list(_top_level())
    for section, names in _sections().items():
        keys += [f"{section}.{n}" for n in names]
    return keys


def resolve_key(key: str) -> str:
    """The canonical key (``name`` or ``section.name``) for a user's spelling of one."""
    k = key.strip().replace("-", "_")
    sections = _sections()
    if "." in k:
        section, _, name = k.partition(".")
        if name in sections.get(section, ()):
            return k
    elif k in _top_level():
        return k
    elif k in FLAG_FIELDS:
        section_or_none, name = FLAG_FIELDS[k]
        return name if section_or_none is None else f"{section_or_none}.{name}"
    else:
        owners = [s for s, names in sections.items() if k in names]
        if len(owners) == 1:
            return f"{owners[0]}.{k}"
    valid = valid_keys()
    close = difflib.get_close_matches(k, valid + list(FLAG_FIELDS), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ExperimentError(
        f"unknown key {key!r}{hint}; valid keys: {', '.join(valid)}; or a simulate flag name: "
        f"{', '.join(sorted(FLAG_FIELDS))}"
    )


#: Fields whose value is itself a table (kept whole, not flattened into keys).
TABLE_FIELDS: frozenset[str] = frozenset({"policy_options", "policy_option"})


def flatten_table(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"workload": {"request_rate": [1]}}`` → ``{"workload.request_rate": [1]}`` (a
    table-valued field, ``engine.policy_options``, stays one value)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name.rpartition(".")[2] not in TABLE_FIELDS:
            out.update(flatten_table(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    """Set canonical ``key`` in a (user-level, nested) SimConfig dict, in place."""
    section, _, name = key.rpartition(".")
    target = config.setdefault(section, {}) if section else config
    target[name] = value


def set_seed(config: dict[str, Any], seed: int) -> None:
    """A run's seed, at the top level and as ``workload.seed`` (``SimConfig`` takes the top-level
    spelling as the workload's seed and rejects the two if they differ)."""
    config["seed"] = seed
    config.setdefault("workload", {})["seed"] = seed


def full_config(user: Mapping[str, Any]) -> dict[str, Any]:
    """The complete, validated ``SimConfig`` dict for a user-level dict.

    Applies ``twinserve simulate``'s defaults (the embedded trace workload when no dataset is
    named; a request rate with a trace = synthetic arrivals), validates the config, the engine
    and KV resolution (the model must fit) and the trace file's existence.
    """
    from sim.config import SimConfig, resolve_engine_config
    from workload.traces import resolve_trace_path

    plain: dict[str, Any] = json.loads(json.dumps(user))  # a deep copy of plain data
    cfg = SimConfig.from_dict(config_dict_from_args(argparse.Namespace(), plain))
    resolve_engine_config(cfg)
    if cfg.workload.dataset_name == "trace" and cfg.workload.dataset_path:
        resolve_trace_path(cfg.workload.dataset_path)
    return cfg.to_dict()


# -- the file ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Variant:
    """A named group of overrides (canonical key → value) applied on top of the base."""

    name: str
    overrides: tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class ExperimentSpec:
    """A parsed experiment file (see the module docstring); keys are canonical."""

    name: str
    base: Mapping[str, Any]  # user-level SimConfig dict
    axes: tuple[tuple[str, tuple[Any, ...]], ...]  # grid axes in file order
    variants: tuple[Variant, ...]  # at least one (an unnamed one when the file has none)
    seeds: tuple[int, ...]
    report: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_REPORT))
    description: str = ""

    def __post_init__(self) -> None:
        if not self.variants:
            raise ExperimentError("an experiment needs at least one variant")
        if not self.seeds:
            raise ExperimentError("seeds must not be empty")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ExperimentError(f"variant names must be unique, got {names}")

    @property
    def axis_keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.axes)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One run of a sweep: its labels and its complete config dict."""

    index: int  # position in the experiment's point order
    variant: str
    seed: int
    axis_values: tuple[tuple[str, Any], ...]  # (canonical key, value) of each grid axis
    config: Mapping[str, Any]  # the full SimConfig dict (``SimConfig.to_dict()``)


def parse_experiment(
    data: Mapping[str, Any], *, default_name: str = "experiment"
) -> ExperimentSpec:
    """An ``ExperimentSpec`` from a loaded file; raises ``ExperimentError`` listing all errors."""
    errors: list[str] = []
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        errors.append(f"unknown table(s)/key(s) {', '.join(unknown)} at the top level; "
                      f"valid: {', '.join(FILE_KEYS)}")
    base = data.get("base", {})
    if not isinstance(base, Mapping):
        errors.append("[base] must be a table")
        base = {}
    axes, seeds = _parse_grid(data.get("grid", {}), errors)
    sweep = data.get("sweep", {})
    if isinstance(sweep, Mapping):
        bad = sorted(set(sweep) - set(SWEEP_KEYS))
        if bad:
            errors.append(f"unknown key(s) {', '.join(bad)} in [sweep]; valid: "
                          f"{', '.join(SWEEP_KEYS)}")
        if "seeds" in sweep:
            seeds = _seed_list(sweep["seeds"], "[sweep] seeds", errors)
    else:
        errors.append("[sweep] must be a table")
    if seeds is None:
        seeds = (int(base.get("seed", 0)),)
    variants = _parse_variants(data.get("variant", []), errors)
    report = _parse_report(data.get("report", {}), errors)
    name = data.get("name")
    if name is not None and not (
        isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name)
    ):
        errors.append(f"name must be letters, digits, '.', '_' or '-' (it names the default "
                      f"output directory runs/sweep-NAME), got {name!r}")
    if errors:
        raise ExperimentError("invalid experiment file:\n  " + "\n  ".join(errors))
    return ExperimentSpec(
        name=str(data.get("name") or default_name), base=dict(base), axes=axes,
        variants=variants, seeds=seeds, report=report,
        description=str(data.get("description") or ""),
    )


def load_experiment(path: str | Path) -> ExperimentSpec:
    """Read and parse an experiment file (TOML or JSON)."""
    data = load_experiment_file(str(path))
    try:
        return parse_experiment(data, default_name=Path(path).stem)
    except ExperimentError as exc:
        raise ExperimentError(f"{path}: {exc}") from None


def _seed_list(value: Any, where: str, errors: list[str]) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (not isinstance(value, list) or not value
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)):
        errors.append(f"{where} must be a non-empty list of integers, got {value!r}")
        return None
    return tuple(value)


def _parse_grid(
    grid: Any, errors: list[str]
) -> tuple[tuple[tuple[str, tuple[Any, ...]], ...], tuple[int, ...] | None]:
    if not isinstance(grid, Mapping):
        errors.append("[grid] must be a table of key = [values]")
        return (), None
    axes: list[tuple[str, tuple[Any, ...]]] = []
    seeds: tuple[int, ...] | None = None
    for key, values in flatten_table(grid).items():
        if key in SEED_KEYS:
            seeds = _seed_list(values, f"[grid] {key}", errors)
            continue
        try:
            canonical = resolve_key(key)
        except ExperimentError as exc:
            errors.append(f"[grid]: {exc}")
            continue
        if not isinstance(values, list) or not values:
            errors.append(f"[grid] {key} must be a non-empty list of values (one per point); "
                          "put fixed values in [base]")
            continue
        if canonical == "workload.seed":
            errors.append(f"[grid] {key}: give the run's seeds as seeds = [...] (every point "
                          "runs once per seed, which would override this axis)")
            continue
        if canonical in (k for k, _ in axes):
            errors.append(f"[grid] {key} names the same setting as another axis ({canonical})")
            continue
        axes.append((canonical, tuple(values)))
    return tuple(axes), seeds


def _parse_variants(raw: Any, errors: list[str]) -> tuple[Variant, ...]:
    if not raw:
        return (Variant("", ()),)
    if not isinstance(raw, list) or not all(isinstance(v, Mapping) for v in raw):
        errors.append("[[variant]] must be an array of tables, each with a name")
        return (Variant("", ()),)
    variants = []
    for i, table in enumerate(raw):
        table = dict(table)
        name = table.pop("name", None)
        if not isinstance(name, str) or not name:
            errors.append(f"[[variant]] #{i + 1} needs a non-empty name")
            name = f"variant{i + 1}"
        overrides = []
        for key, value in flatten_table(table).items():
            if key in SEED_KEYS:
                errors.append(f"[[variant]] {name}: seeds belong in [grid] or [sweep]")
                continue
            try:
                overrides.append((resolve_key(key), value))
            except ExperimentError as exc:
                errors.append(f"[[variant]] {name}: {exc}")
        variants.append(Variant(name, tuple(overrides)))
    return tuple(variants)


def _parse_report(raw: Any, errors: list[str]) -> dict[str, Any]:
    from reports.options import parse_goodput, parse_percentile_metrics, parse_percentiles

    report = dict(DEFAULT_REPORT)
    if not isinstance(raw, Mapping):
        errors.append("[report] must be a table")
        return report
    bad = sorted(set(raw) - set(REPORT_KEYS))
    if bad:
        errors.append(f"unknown key(s) {', '.join(bad)} in [report]; valid: "
                      f"{', '.join(REPORT_KEYS)}")
    for key in ("goodput", "percentiles", "percentile_metrics"):
        value = raw.get(key)
        if value is not None and not isinstance(value, list | tuple) and not (
            key == "goodput" and isinstance(value, Mapping)
        ):
            errors.append(
                f"[report] {key} must be a list"
                + (' (e.g. ["ttft:500", "tpot:50"]) or a table' if key == "goodput" else "")
                + f", got {value!r}"
            )
            return report
    try:
        if "goodput" in raw:
            goodput = raw["goodput"]
            report["goodput"] = (dict(goodput) if isinstance(goodput, Mapping)
                                 else parse_goodput(list(goodput)))
        if "percentiles" in raw:
            report["percentiles"] = parse_percentiles(list(raw["percentiles"]))
        if "percentile_metrics" in raw:
            report["percentile_metrics"] = parse_percentile_metrics(list(raw["percentile_metrics"]))
    except (ValueError, TypeError) as exc:  # reports' ReportError is a ValueError
        errors.append(f"[report]: {exc}")
    return report


def with_base_overrides(spec: ExperimentSpec, pairs: Sequence[str]) -> ExperimentSpec:
    """``spec`` with ``KEY=VALUE`` pairs (JSON values, else strings) set in its base."""
    base = json.loads(json.dumps(spec.base))
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ExperimentError(f"invalid --set {pair!r}: use KEY=VALUE, e.g. num_prompts=200")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        path = resolve_key(key)
        if path in spec.axis_keys:
            raise ExperimentError(
                f"--set {key}: {path} is a [grid] axis, whose values would override it; "
                "change them in the file"
            )
        set_key(base, path, value)
    return dataclasses.replace(spec, base=base)


# -- points --------------------------------------------------------------------------------------
def expand_points(spec: ExperimentSpec) -> list[SweepPoint]:
    """Every point of the experiment, validated; raises one ``ExperimentError`` with all errors
    (identical messages grouped, with the number of points they affect)."""
    keys = spec.axis_keys
    grid = list(itertools.product(*(values for _, values in spec.axes)))
    points: list[SweepPoint] = []
    failures: dict[str, list[str]] = {}
    for variant in spec.variants:
        for combo in grid:
            for seed in spec.seeds:
                user = json.loads(json.dumps(spec.base))
                for key, value in variant.overrides:
                    set_key(user, key, value)
                for key, value in zip(keys, combo, strict=True):
                    set_key(user, key, value)
                set_seed(user, seed)
                axis_values = tuple(zip(keys, combo, strict=True))
                label = describe_point(variant.name, axis_values, seed)
                try:
                    config = full_config(user)
                except UserError as exc:
                    failures.setdefault(str(exc), []).append(label)
                    continue
                points.append(SweepPoint(len(points), variant.name, seed, axis_values, config))
    if failures:
        lines = []
        for message, labels in failures.items():
            more = f" and {len(labels) - 1} more point(s)" if len(labels) > 1 else ""
            lines.append(f"{labels[0]}{more}: {message}")
        raise ExperimentError("invalid sweep point(s):\n  " + "\n  ".join(lines))
    return points


def describe_point(variant: str, axis_values: Sequence[tuple[str, Any]], seed: int) -> str:
    parts = ([f"variant {variant}"] if variant else []) + [f"{k}={v}" for k, v in axis_values]
    return "point (" + ", ".join([*parts, f"seed={seed}"]) + ")"
