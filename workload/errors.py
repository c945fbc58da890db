"""The exception of this package: a workload that cannot be built."""

from __future__ import annotations

from engine.core.errors import UserError


class WorkloadError(UserError):
    """A workload cannot be built: bad parameters or an unreadable trace file."""
