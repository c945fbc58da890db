"""Fixtures of the validation tests: one tiny checkpoint per session, torch single-threaded
(on this small shared machine intra-op threads only spin against each other)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from engine.worker.tiny_model import TinyModelSpec, make_tiny_model

    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(arch="llama"))
