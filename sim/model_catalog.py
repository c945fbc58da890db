"""The shipped model catalog, and ``--model`` resolution (a name, an alias or a path).

``sim/data/models/`` holds the config.json of commonly deployed open models (named
``<org>__<name>.json`` after their Hugging Face id), ``catalog.csv`` (per model: file, extra
aliases, the published total and active parameter counts and their source) and ``SOURCES.md``
(where each file comes from). Every model also answers to the lower-cased last part of its id
(``llama-3.1-70b``, ``qwen3-30b-a3b``, ``deepseek-v3``).

A ``--model`` that is no catalog name is read as a path to a config.json or a model
directory; its spec is cached per file contents' modification time within a process.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from sim.hf_config import load_model_config
from sim.models import ModelSpec, UnknownModelError

DATA_DIR = Path(__file__).resolve().parent / "data" / "models"


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One shipped model: its spec and the published facts it is checked against."""

    spec: ModelSpec
    file: str  # the config.json under sim/data/models
    aliases: tuple[str, ...]
    published_total_params: int
    published_active_params: int | None  # MoE models
    active_excludes_embedding: bool  # the publisher's active count leaves the embedding out
    source: str  # where the published counts come from


@cache
def catalog() -> dict[str, CatalogEntry]:
    """Every shipped model by Hugging Face id (read once per process)."""
    out: dict[str, CatalogEntry] = {}
    with (DATA_DIR / "catalog.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            hf_id = row["hf_id"]
            extra = tuple(a for a in row["aliases"].split() if a)
            active = row["published_active_params"]
            out[hf_id] = CatalogEntry(
                spec=load_model_config(DATA_DIR / row["file"], name=hf_id),
                file=row["file"],
                aliases=(hf_id.rsplit("/", 1)[-1].lower(), *extra),
                published_total_params=int(row["published_total_params"]),
                published_active_params=int(active) if active else None,
                active_excludes_embedding=row["active_excludes_embedding"] == "yes",
                source=row["source"],
            )
    return out


@cache
def _by_key() -> dict[str, str]:
    """Lower-cased ids and aliases → Hugging Face id."""
    keys: dict[str, str] = {}
    for hf_id, entry in catalog().items():
        keys[hf_id.lower()] = hf_id
        for alias in entry.aliases:
            keys.setdefault(alias, hf_id)
    return keys


def model_names() -> list[str]:
    return list(catalog())


def get_model(name: str) -> ModelSpec:
    """A catalog model by id or alias (case-insensitive), else a config.json / model
    directory at that path; anything else is an error listing the catalog."""
    key = name.strip()
    hf_id = _by_key().get(key.lower())
    if hf_id is not None:
        return catalog()[hf_id].spec
    if key and os.path.exists(key):
        path = os.path.abspath(key)
        return _load_path(key, path, os.stat(path).st_mtime_ns)
    raise UnknownModelError(
        f"unknown model {name!r}; valid: {', '.join(catalog())}, or a path to a config.json "
        "or a model directory (twinserve simulate --list-models)"
    )


@lru_cache(maxsize=64)
def _load_path(name: str, path: str, mtime_ns: int) -> ModelSpec:
    return load_model_config(path, name=name)
