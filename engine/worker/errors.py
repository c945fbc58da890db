"""Errors the worker raises for input the user gave it (one line each on the CLI).

Every class here subclasses ``engine.core.errors.UserError``: a checkpoint that is missing or
corrupt, a model family we do not implement, or a KV cache that cannot hold one sequence are the
user's to fix, not bugs, so the CLI prints ``twinserve: error: …`` and exits with status 2.
"""

from __future__ import annotations

from engine.core.errors import UserError


class CheckpointError(UserError):
    """A checkpoint directory is missing, incomplete or corrupt; the message names the file."""


class UnsupportedModelError(UserError):
    """The checkpoint's architecture or one of its options is not implemented here."""


class KVCacheSizeError(UserError):
    """The KV cache cannot hold even one ``max_model_len`` sequence (or has no usable block)."""


class DeviceError(UserError):
    """The requested device or dtype is unavailable on this machine."""
