"""Which implementation runs the paged-attention ops: Triton kernels or the torch reference.

Responsibility: map a device and an optional preference to one ``AttentionBackend``, without
importing Triton or touching a GPU, so the worker can decide once at start-up.

Rules (``select_backend``):

* an explicit ``prefer`` wins; otherwise the ``TWINSERVE_ATTENTION_BACKEND`` environment variable
  (``triton``, ``reference`` or ``auto``); otherwise ``auto``;
* ``auto``: Triton on CUDA devices, the torch reference everywhere else;
* ``triton`` on a CPU device runs the kernels in the Triton interpreter, which needs
  ``TRITON_INTERPRET=1`` in the environment *before the kernels are first launched* (Triton decides
  interpreted-or-compiled when the kernel module is imported, and ``kernels`` imports it lazily);
  without it ``select_backend`` raises a ``ValueError`` that says so;
* ``triton`` on any other device type is an error.
"""

from __future__ import annotations

import enum
import os

import torch

#: Environment variable naming the preferred backend (``triton``, ``reference`` or ``auto``).
BACKEND_ENV_VAR = "TWINSERVE_ATTENTION_BACKEND"
#: Triton's switch for its CPU interpreter.
INTERPRET_ENV_VAR = "TRITON_INTERPRET"
_TRUTHY = frozenset({"1", "true", "on", "yes"})
_AUTO = "auto"


class AttentionBackend(enum.Enum):
    """An implementation of ``paged_attention`` and ``reshape_and_cache``."""

    TRITON = "triton"  # our Triton kernels (compiled on CUDA, interpreted on CPU)
    REFERENCE = "reference"  # plain torch, fp32 math, one sequence at a time


def is_triton_interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` asks Triton to interpret kernels on the CPU."""
    return os.environ.get(INTERPRET_ENV_VAR, "0").strip().lower() in _TRUTHY


def parse_backend(value: AttentionBackend | str, *, source: str = "backend") -> AttentionBackend:
    """Turn ``value`` into an ``AttentionBackend``; ``source`` names it in the error message."""
    if isinstance(value, AttentionBackend):
        return value
    if isinstance(value, str):
        for backend in AttentionBackend:
            if value.strip().lower() == backend.value:
                return backend
    choices = ", ".join(repr(b.value) for b in AttentionBackend)
    raise ValueError(f"{source}={value!r} is not an attention backend; choose one of {choices}")


def select_backend(
    device: torch.device | str, prefer: AttentionBackend | str | None = None
) -> AttentionBackend:
    """Pick the backend for tensors on ``device`` (see the module docstring for the rules)."""
    dev = torch.device(device)
    source = "prefer"
    choice: AttentionBackend | str | None = prefer
    if choice is None:
        choice, source = os.environ.get(BACKEND_ENV_VAR) or None, BACKEND_ENV_VAR
    if choice is None or (isinstance(choice, str) and choice.strip().lower() == _AUTO):
        return AttentionBackend.TRITON if dev.type == "cuda" else AttentionBackend.REFERENCE
    backend = parse_backend(choice, source=source)
    if backend is AttentionBackend.TRITON:
        check_triton_device(dev)
    return backend


def check_triton_device(device: torch.device) -> None:
    """Raise ``ValueError`` unless the Triton kernels can run on ``device``."""
    if device.type == "cuda":
        return
    if device.type == "cpu":
        if not is_triton_interpreter_enabled():
            raise ValueError(
                "the triton attention backend on a CPU device needs the Triton interpreter: set "
                f"{INTERPRET_ENV_VAR}=1 before the kernels are first launched, or use the "
                "'reference' backend"
            )
        return
    raise ValueError(
        f"the triton attention backend runs on cuda (or cpu with {INTERPRET_ENV_VAR}=1), "
        f"not on {device.type}"
    )
