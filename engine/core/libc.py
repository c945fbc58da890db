"""The process's C library through ``ctypes``, loaded once per process.

Three things reach past Python into libc: naming a process (``process_name``), dying with the
parent (``engine.process_guard``) and tuning malloc in the report process
(``reports.report_process``). They share this one loader: on Linux, glibc by its soname
(``libc.so.6``: no search, where ``ctypes.util.find_library`` would run ``ldconfig -p`` in a
child process), else the running process's own symbols, which hold the C library Python is
linked with (musl); None elsewhere or where neither opens, and each caller then skips what
it needed it for (a symbol it looks for may be missing: callers check).
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

#: glibc's soname on every Linux platform it supports.
GLIBC_SONAME = "libc.so.6"


@cache
def libc() -> ctypes.CDLL | None:
    """The C library (with ``errno`` kept for ``ctypes.get_errno``), or None off Linux or
    where none can be opened. A forked child shares its parent's loaded copy."""
    if not sys.platform.startswith("linux"):
        return None
    for name in (GLIBC_SONAME, None):  # None: the process's own symbols
        try:
            return ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
    return None
