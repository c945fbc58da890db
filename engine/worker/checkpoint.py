"""Read the weights of a local Hugging Face checkpoint: one or several safetensors files.

Responsibility: find the weight files of a checkpoint directory — ``model.safetensors``, or the
shards listed by ``model.safetensors.index.json`` — check that they exist and parse, and yield
``(name, tensor)`` pairs one file at a time (so peak host memory is one shard). Every problem is
a ``CheckpointError`` naming the file. Local paths only: nothing here touches a network or a hub.
``safetensors`` is imported only when weights are read, so dummy-weight runs do not need it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from engine.worker.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint, in a stable order; raises CheckpointError."""
    root = Path(model_dir)
    index = root / INDEX_FILE
    if index.exists():
        return _shards_from_index(index)
    single = root / SINGLE_FILE
    if single.exists():
        return [single]
    raise CheckpointError(
        f"{root} has neither {SINGLE_FILE} nor {INDEX_FILE}: no weights to load "
        "(only safetensors checkpoints are supported)"
    )


def _shards_from_index(index: Path) -> list[Path]:
    try:
        raw = json.loads(index.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{index} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {index}: {exc}") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no 'weight_map' object")
    files = sorted({str(f) for f in weight_map.values()})
    shards = [index.parent / f for f in files]
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"{index} lists {shard.name}, which is missing")
    return shards


def iter_weights(
    model_dir: str | Path,
    device: torch.device,
    wanted: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every tensor of the checkpoint (those ``wanted`` says a rank needs, when given),
    loaded onto ``device`` in its stored dtype."""
    try:
        from safetensors import safe_open
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CheckpointError(
            "reading safetensors checkpoints needs the 'safetensors' package "
            "(pip install twinserve[real])"
        ) from exc
    load_device = "cpu" if device.type == "cpu" else str(device)
    for file in weight_files(model_dir):
        try:
            handle = safe_open(str(file), framework="pt", device=load_device)
        except Exception as exc:  # safetensors raises its own error types (and OSError)
            raise CheckpointError(f"{file} is not a readable safetensors file: {exc}") from None
        with handle as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles are not mappings
                if wanted is not None and not wanted(name):
                    continue
                try:
                    tensor = f.get_tensor(name)
                except Exception as exc:
                    raise CheckpointError(f"{file}: cannot read tensor {name!r}: {exc}") from None
                yield name, tensor
