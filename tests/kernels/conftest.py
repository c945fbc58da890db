"""Kernel tests run the Triton kernels on CPU tensors through the Triton interpreter.

Triton decides interpreted-or-compiled when a kernel module is imported, and ``kernels`` imports
its Triton modules lazily at the first launch, so setting ``TRITON_INTERPRET`` here (before any
test module of this directory launches a kernel) is enough. ``setdefault`` leaves an explicit
setting alone. Other test directories are unaffected: on CPU the default backend is the torch
reference whatever this variable says.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

_KERNEL_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# triton 3.6's interpreter turns 1-element arrays into loop bounds with int(); numpy 2.3 warns.
_INTERPRETER_WARNING = "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Silence the interpreter's numpy deprecation warning in this directory's tests only."""
    for item in items:
        if str(item.path).startswith(_KERNEL_TESTS_DIR):
            item.add_marker(pytest.mark.filterwarnings(_INTERPRETER_WARNING))
