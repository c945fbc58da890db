"""The one exception type of ``reports``: bad input from the user (a flag, a run directory).

It is a ``UserError`` (``engine.core.errors``), so the CLI reports it in one line wherever it
surfaces, and a ``ValueError`` like every input error of the project.
"""

from __future__ import annotations

from engine.core.errors import UserError


class ReportError(UserError):
    """Bad report input: the message says what is wrong and what is valid."""
