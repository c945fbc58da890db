"""The one exception type of ``reports``: bad input from the user (a flag, a run directory).

It subclasses ``ValueError`` so that ``reports`` stays free of project imports; the CLI layer
(``experiments/cli/cmd_reports.py``) turns it into the project's one-line ``UserError``.
"""

from __future__ import annotations


class ReportError(ValueError):
    """Bad report input: the message says what is wrong and what is valid."""
