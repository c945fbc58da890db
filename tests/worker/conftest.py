"""Fixtures of the worker tests: tiny checkpoints written once per session, HF references.

Torch runs single-threaded here: on this small shared machine, intra-op threads only spin
against each other (a tiny model's decode step takes ~4 ms on one thread, ~90 ms on two).
``TRITON_INTERPRET`` is set (as in tests/kernels) so the one test that runs the Triton kernels
inside the model can use the interpreter; the default CPU backend stays the torch reference.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest
import torch

from engine.worker.tiny_model import TinyModelSpec, make_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama 3 style: GQA (4 query / 2 KV heads), llama3 RoPE scaling, untied embeddings."""
    return make_tiny_model(tmp_path_factory.mktemp("llama"), TinyModelSpec(arch="llama"))


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2 style: QKV bias, tied embeddings, sharded safetensors with an index file."""
    return make_tiny_model(
        tmp_path_factory.mktemp("qwen2"), TinyModelSpec(arch="qwen2", num_shards=2)
    )
