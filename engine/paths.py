"""Paths the user gives: checked before anything is opened, each problem named in one line.

Every command reads its input files and directories through ``input_file`` / ``input_dir`` /
``read_text`` and checks where an output directory may go with ``output_location``, so the same
fault reads the same way everywhere: a missing file, a name too long, a symbolic-link loop, a
FIFO, a device such as ``/dev/null``, a directory where a file belongs, a file without read
permission, bytes that are not UTF-8 — each is a ``PathError`` (a ``UserError``: one
``twinserve: error:`` line) that says which of them it is.

Invariants: nothing here opens a FIFO, a device or a socket (``os.stat`` decides first, so a
named pipe never blocks a command); text is decoded as UTF-8 with an optional byte-order mark
(``utf-8-sig``), the encoding every file format here is defined in.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from engine.core.errors import UserError

#: The longest file name (one path component) most file systems accept, in bytes.
NAME_MAX_BYTES = 255


class PathError(UserError):
    """A path that cannot be used as given (the message names the path and the problem)."""


def shown(path: str | os.PathLike[str], limit: int = 80) -> str:
    """``path`` for a message: long names are shortened (a 300-byte name would fill the line)."""
    text = os.fspath(path)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}…{text[-(limit // 4):]} ({len(os.fsencode(text))} bytes)"


def _kind(mode: int) -> str:
    """What a non-regular, non-directory file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def describe_os_error(exc: OSError, path: str | os.PathLike[str], what: str) -> str:
    """One line for an ``OSError`` met at ``path`` (``what`` names the path's role)."""
    p = shown(path)
    code = exc.errno
    if code == errno.ENOENT:
        if os.path.islink(path):
            return f"{what} {p} is a symbolic link to {os.readlink(path)!r}, which does not exist"
        return f"{what} {p} does not exist"
    if code == errno.ELOOP:
        return f"{what} {p} is a symbolic link loop (it never reaches a file)"
    if code == errno.ENAMETOOLONG:
        return (f"{what} {p}: a file name is too long (at most {NAME_MAX_BYTES} bytes per "
                "name)")
    if code in (errno.EACCES, errno.EPERM):
        return f"{what} {p} is not readable or writable here: permission denied"
    if code == errno.ENOTDIR:
        return f"{what} {p}: a parent of it is not a directory"
    if code == errno.EISDIR:
        return f"{what} {p} is a directory"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device holding {p} (writing {what})"
    if code == errno.EROFS:
        return f"{what} {p} is on a read-only file system"
    return f"{what} {p}: {exc.strerror or exc}"


def stat_path(path: str | os.PathLike[str], what: str) -> os.stat_result:
    """``os.stat(path)`` (links followed), or a ``PathError`` naming the problem."""
    check_name_lengths(path, what)
    try:
        return os.stat(path)
    except OSError as exc:
        raise PathError(describe_os_error(exc, path, what)) from None
    except ValueError:  # an embedded NUL byte
        raise PathError(f"{what} {shown(path)!r} is not a valid path") from None


def input_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` as a readable regular file (symbolic links followed); a ``PathError`` names
    anything else, without opening special files."""
    st = stat_path(path, what)
    if stat.S_ISDIR(st.st_mode):
        raise PathError(f"{what} {shown(path)} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise PathError(f"{what} {shown(path)} is {_kind(st.st_mode)}, not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise PathError(describe_os_error(exc, path, what)) from None
    return Path(path)


def input_dir(path: str | os.PathLike[str], what: str = "directory") -> Path:
    """``path`` as a directory this process may list and read (symbolic links followed)."""
    st = stat_path(path, what)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
        raise PathError(f"{what} {shown(path)} is {kind}, not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise PathError(f"{what} {shown(path)} is not readable: permission denied")
    return Path(path)


def read_bytes(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """The contents of the regular file ``path`` (``input_file``'s checks first)."""
    input_file(path, what)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise PathError(describe_os_error(exc, path, what)) from None


def decode_text(data: bytes, path: str | os.PathLike[str], what: str = "file") -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); non-UTF-8 bytes are a
    ``PathError`` that says where, and what such a file usually is."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        hint = ""
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            hint = ": it looks UTF-16 encoded; save it as UTF-8"
        elif data[:2] == b"\x1f\x8b":
            hint = ": it is gzip-compressed; decompress it first"
        elif data[:4] == b"PAR1":
            hint = ": it is a Parquet file, not text"
        else:
            hint = ": a binary file?"
        raise PathError(
            f"{what} {shown(path)} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}){hint}"
        ) from None


def read_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """The UTF-8 text of the regular file ``path`` (see ``decode_text``)."""
    return decode_text(read_bytes(path, what), path, what)


def check_name_lengths(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a path with a component longer than a file system accepts, before any work."""
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX_BYTES:
            where = "" if part == os.fspath(path) else f" in {shown(path)}"
            raise PathError(
                f"{what}: the name {shown(part, 40)}{where} is too long (at most "
                f"{NAME_MAX_BYTES} bytes per name)"
            )


def output_location(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """Where an output directory ``path`` can be written, checked before any work starts:
    the absolute path with a final symbolic link resolved. Refused: an existing path that is
    not a directory (a file, ``/dev/null``, a FIFO), a symbolic-link loop, a name too long, a
    parent that is a file, and a parent this process cannot write in (the directory is
    created, or replaced, beside its old self)."""
    check_name_lengths(path, what)
    p = Path(os.path.abspath(path))
    if os.path.islink(p):
        try:
            p = Path(os.path.realpath(p, strict=True))
        except OSError as exc:
            raise PathError(describe_os_error(exc, path, what)) from None
    try:
        st: os.stat_result | None = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise PathError(describe_os_error(exc, path, what)) from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
        raise PathError(f"{what} {shown(path)} exists and is {kind}, not a directory")
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        if ancestor.is_symlink() or os.path.lexists(ancestor):
            break
        ancestor = ancestor.parent
    if os.path.lexists(ancestor) and not ancestor.is_dir():
        raise PathError(f"{what} {shown(path)}: {shown(ancestor)} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PathError(f"{what} {shown(path)}: cannot write in {shown(ancestor)} "
                        "(permission denied)")
    return p


def check_free_space(directory: str | os.PathLike[str], need_bytes: int, what: str) -> None:
    """Refuse to start a job whose output (``need_bytes``) cannot fit where it goes."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return  # unknown: the write itself will say
    free = st.f_bavail * st.f_frsize
    if free < need_bytes:
        raise PathError(
            f"no space left for {what} in {shown(directory)}: {free:,} bytes free, it needs "
            f"about {need_bytes:,}"
        )
