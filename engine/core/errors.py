"""The one exception type that means "the user gave us something wrong".

Every module that validates user input (configs, workload files, checkpoints, CLI flags) raises
a subclass of ``UserError``; the CLI reports those in one line (exit status 2) and lets any
other exception — a bug — show its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input: a file, a flag, a name. The message says what is wrong and what is valid."""
