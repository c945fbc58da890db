"""Fixtures of the load generator's tests: a tiny checkpoint with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.worker.tiny_model import TinyModelSpec, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(arch="llama"))
