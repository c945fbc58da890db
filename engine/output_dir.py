"""Output directories written whole or not at all, one writer at a time, checked by readers.

Every directory twinserve writes (a run directory, a sweep's or a plan's results, a
comparison, a tiny checkpoint, a validation) goes through ``OutputDir``:

1. ``open`` checks the location (``engine.paths.output_location``), takes an exclusive lock
   on a sibling lock file (a second writer of the same directory is refused, naming the
   first one's pid), repairs what an earlier writer killed mid-commit left, refuses to
   replace a non-empty directory that is not one of ours, and creates an empty *staging*
   directory beside the target (``.NAME.partial-PID``);
2. the command writes everything into ``staging``;
3. ``commit`` writes ``manifest.json`` last — every file's size and SHA-256, the row count
   of each table — fsyncs, and swaps the staging directory in place of the old one with
   renames, so a rerun replaces the directory as a whole (no stale plots or foreign files).
   Entries named in ``keep`` (a sweep's ``cache/``, a validation's profile) live in the
   target directory itself while the command runs, so an interrupted command keeps them;
   they move into the new directory at the commit.

An interruption (any exception, a signal turned into one) removes the staging directory; a
``kill -9`` leaves it behind, and the next writer removes it. Readers call
``read_manifest`` + ``verify_files``: a directory without a manifest, or whose files differ
from it, is refused in one line naming the file and the difference.

Forked children (the report process, pool workers) drop their copies of the lock, so a child
that outlives its parent neither keeps the directory locked nor can publish it (only the
process that opened it commits). ``atomic_write_*`` / ``atomic_path`` write single files the
same way: a temporary sibling renamed over the target.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.paths import NAME_MAX_BYTES, describe_os_error, output_location, shown

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "twinserve-output"
MANIFEST_VERSION = 1


class OutputError(UserError):
    """An output directory that cannot be written, or one a reader must refuse."""


# -- single files -------------------------------------------------------------------------------
def _sibling(path: Path, tag: str) -> Path:
    """A hidden sibling of ``path`` named after it (a digest when the name would be too long)."""
    name = f".{path.name}.{tag}"
    if len(os.fsencode(name)) > NAME_MAX_BYTES:
        digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]
        name = f".twinserve-{digest}.{tag}"
    return path.with_name(name)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an exception the
    file written there replaces ``path`` in one rename (else it is removed). For writers that
    take a path (pyarrow, matplotlib, safetensors)."""
    target = Path(path)
    tmp = _sibling(target, f"tmp-{os.getpid()}")
    try:
        yield tmp
        with contextlib.suppress(OSError), open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (readers see the old file or the new one)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode())


# -- the lock -----------------------------------------------------------------------------------
_HELD_LOCK_FDS: set[int] = set()


def _drop_inherited_locks() -> None:
    """In a forked child: close the copies of the parent's lock files (the parent keeps its
    locks; the child can neither hold them past the parent nor release them early)."""
    for fd in list(_HELD_LOCK_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_LOCK_FDS.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


class OutputLock:
    """An exclusive ``flock`` on ``.NAME.lock`` beside a directory, held by one writer."""

    def __init__(self, lock_path: Path, fd: int) -> None:
        self.lock_path = lock_path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, target: Path, what: str) -> OutputLock:
        """Lock ``target`` or raise ``OutputError`` naming the process that holds it."""
        lock_path = _sibling(target, "lock")
        for _ in range(10):
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputError(describe_os_error(exc, lock_path, f"{what}'s lock")) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise OutputError(
                    f"{what} {shown(target)} is being written by another twinserve process "
                    f"(pid {holder}): wait for it to finish, or choose another directory"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False  # the last holder removed it as we opened it: try again
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                _HELD_LOCK_FDS.add(fd)
                return cls(lock_path, fd)
            os.close(fd)
        raise OutputError(f"cannot lock {shown(target)}: its lock file keeps changing")

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.lock_path)  # while still locked: no one can lock a removed file
        _HELD_LOCK_FDS.discard(self._fd)
        os.close(self._fd)
        self._fd = None


# -- the manifest -------------------------------------------------------------------------------
def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex) of ``path``."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())
    return size, h.hexdigest()


def _files_under(root: Path, skip: Iterable[str]) -> list[str]:
    skipped = set(skip) | {MANIFEST_NAME}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = sorted(d for d in dirnames if d not in skipped)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel not in skipped:
                out.append(rel)
    return out


def build_manifest(root: Path, kind: str, *, rows: Mapping[str, int] | None = None,
                   data: Sequence[str] = (), info: Mapping[str, Any] | None = None,
                   skip: Iterable[str] = ()) -> dict[str, Any]:
    """The manifest of the files under ``root``: kind, each file's size and SHA-256 (and row
    count for tables), which files are the data readers must find intact (``data``), and
    kind-specific ``info``."""
    files: dict[str, dict[str, Any]] = {}
    for rel in _files_under(root, skip):
        size, digest = file_digest(root / rel)
        entry: dict[str, Any] = {"bytes": size, "sha256": digest}
        if rows and rel in rows:
            entry["rows"] = int(rows[rel])
        files[rel] = entry
    missing = [name for name in data if name not in files]
    if missing:
        raise OutputError(f"cannot complete {root}: {', '.join(missing)} not written")
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "kind": kind,
            "data": list(data), "files": files, "info": dict(info or {})}


def read_manifest(directory: str | os.PathLike[str], kind: str,
                  what: str = "directory") -> dict[str, Any]:
    """The manifest of a directory written by ``OutputDir``, or an ``OutputError`` that says
    why the directory cannot be trusted (no manifest: an interrupted write, or an older
    twinserve; another kind; a manifest that is not ours)."""
    d = Path(directory)
    path = d / MANIFEST_NAME
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise OutputError(
            f"{what} {shown(d)} is incomplete: it has no {MANIFEST_NAME} (the write was "
            "interrupted or failed, or an older twinserve wrote it); write it again"
        ) from None
    except OSError as exc:
        raise OutputError(describe_os_error(exc, path, what)) from None
    try:
        manifest = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OutputError(f"{shown(path)} cannot be read ({exc}): {what} {shown(d)} is "
                          "damaged") from None
    if not (isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT
            and isinstance(manifest.get("files"), dict)):
        raise OutputError(f"{shown(path)} is not a twinserve manifest: {what} {shown(d)} is "
                          "damaged")
    if manifest.get("version") != MANIFEST_VERSION:
        raise OutputError(f"{shown(path)} has version {manifest.get('version')!r}, this "
                          f"twinserve reads version {MANIFEST_VERSION}")
    if manifest.get("kind") != kind:
        raise OutputError(f"{what} {shown(d)} holds a twinserve {manifest.get('kind')} "
                          f"directory, not a {kind} directory")
    return manifest


def verify_files(directory: str | os.PathLike[str], manifest: Mapping[str, Any],
                 names: Iterable[str], what: str = "directory") -> None:
    """Refuse the directory unless each of ``names`` exists with the size and SHA-256 its
    manifest lists (sizes first: a cut file is found without reading it)."""
    d = Path(directory)
    files: Mapping[str, Any] = manifest["files"]
    for name in names:
        entry = files.get(name)
        if not isinstance(entry, dict):
            raise OutputError(f"{what} {shown(d)}: {name} is not in its manifest")
        try:
            size = (d / name).stat().st_size
        except FileNotFoundError:
            raise OutputError(f"{what} {shown(d)} is incomplete: {name} is missing") from None
        except OSError as exc:
            raise OutputError(describe_os_error(exc, d / name, what)) from None
        if size != entry.get("bytes"):
            raise OutputError(
                f"{what} {shown(d)}: {name} has {size:,} bytes, its manifest {entry.get('bytes'):,}"
                " — cut short or replaced after the directory was written"
            )
        try:
            _, digest = file_digest(d / name)
        except OSError as exc:
            raise OutputError(describe_os_error(exc, d / name, what)) from None
        if digest != entry.get("sha256"):
            raise OutputError(
                f"{what} {shown(d)}: {name} differs from the file its manifest lists (checksum) "
                "— changed or replaced after the directory was written"
            )


# -- the directory ------------------------------------------------------------------------------
#: What marks a non-empty directory as an earlier output of each kind (written before
#: manifests existed, or cut off before its manifest): such a directory may be replaced.
LEGACY_MARKERS: dict[str, tuple[str, ...]] = {
    "run": ("config.json",),
    "sweep": ("sweep.json", "cache"),
    "plan": ("plan.csv", "cache"),
    "compare": ("compare.json",),
    "checkpoint": ("config.json",),
    "validation": ("validation.json", "validation.md", "profile.csv", "measured"),
}


class OutputDir:
    """One output directory being written (see the module docstring for the protocol).

    ``kind`` names what the directory holds ("run", "sweep" …); ``keep`` names entries that
    live in the target itself while the command runs and survive into the new directory.
    Use it as a context manager: leaving the block without ``commit`` aborts the write."""

    def __init__(self, path: str | os.PathLike[str], kind: str, *, what: str = "--out",
                 keep: Sequence[str] = ()) -> None:
        self.requested = Path(path)
        self.kind = kind
        self.what = what
        self.keep = tuple(keep)
        self.path = output_location(path, what)
        self._lock: OutputLock | None = None
        self._staging: Path | None = None
        self.committed = False

    # -- opening --------------------------------------------------------------------------------
    def open(self) -> OutputDir:
        """Lock the target, repair leftovers, check it may be replaced, create the staging
        directory (all before the command's work starts); missing parents are created."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(describe_os_error(exc, self.path.parent, self.what)) from None
        self._lock = OutputLock.acquire(self.path, self.what)
        try:
            self._recover()
            self._check_replaceable()
            staging = _sibling(self.path, f"partial-{os.getpid()}")
            staging.mkdir()
        except OSError as exc:
            self._release()
            raise OutputError(describe_os_error(exc, self.path, self.what)) from None
        except BaseException:
            self._release()
            raise
        self._staging = staging
        return self

    def __enter__(self) -> OutputDir:
        return self if self._lock is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        if not self.committed:
            self.abort()

    @property
    def staging(self) -> Path:
        """Where the command writes the new directory's files."""
        assert self._staging is not None, "OutputDir.open() first"
        return self._staging

    def live(self, name: str) -> Path:
        """The path of kept entry ``name`` inside the target directory (created, empty, if
        the target does not exist yet), for state that must survive an interruption."""
        assert name in self.keep, f"{name} is not a kept entry"
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputError(describe_os_error(exc, self.path, self.what)) from None
        return self.path / name

    def _siblings(self) -> list[Path]:
        prefix = _sibling(self.path, "").name
        parent = self.path.parent
        try:
            names = os.listdir(parent)
        except OSError:
            return []
        return [parent / n for n in names
                if n.startswith(prefix) and n[len(prefix):].startswith(("partial-", "old-"))]

    def _recover(self) -> None:
        """Finish or undo what a writer killed during a commit left (we hold the lock, so
        every staging or old directory of this target is stale)."""
        leftovers = self._siblings()
        if not self.path.exists():
            done = [p for p in leftovers if "partial-" in p.name and (p / MANIFEST_NAME).exists()]
            old = [p for p in leftovers if "old-" in p.name]
            if done:
                os.rename(done[0], self.path)
            elif old:
                os.rename(old[0], self.path)
            leftovers = self._siblings()
        for stale in leftovers:
            for name in self.keep:
                if (stale / name).exists() and not os.path.lexists(self.path / name):
                    self.path.mkdir(exist_ok=True)
                    os.rename(stale / name, self.path / name)
            shutil.rmtree(stale, ignore_errors=True)

    def _check_replaceable(self) -> None:
        if not self.path.is_dir():
            return
        entries = set(os.listdir(self.path))
        if not entries - set(self.keep):
            return  # empty, or only the state a previous run of this kind kept
        if MANIFEST_NAME in entries:
            try:
                read_manifest(self.path, self.kind, self.what)
            except OutputError as exc:
                raise OutputError(f"{exc}: refusing to replace it") from None
            return
        if entries & set(LEGACY_MARKERS.get(self.kind, ())):
            return
        listed = ", ".join(sorted(entries)[:3]) + (", …" if len(entries) > 3 else "")
        raise OutputError(
            f"{self.what} {shown(self.path)} is not empty and holds no twinserve {self.kind} "
            f"output ({listed}): refusing to replace it; choose a new or empty directory"
        )

    # -- finishing ------------------------------------------------------------------------------
    def commit(self, *, rows: Mapping[str, int] | None = None, data: Sequence[str] = (),
               info: Mapping[str, Any] | None = None) -> Path:
        """Write the manifest and put the staging directory in place of the target; returns
        the target. ``rows``: table file → row count; ``data``: the files readers need."""
        staging = self.staging
        try:
            manifest = build_manifest(staging, self.kind, rows=rows, data=data, info=info,
                                      skip=self.keep)
            atomic_write_text(staging / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
            _fsync_dir(staging)
            for name in self.keep:
                live = self.path / name
                if os.path.lexists(live) and not os.path.lexists(staging / name):
                    os.rename(live, staging / name)
            if self.path.exists():
                old = _sibling(self.path, f"old-{os.getpid()}")
                os.rename(self.path, old)
                os.rename(staging, self.path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(staging, self.path)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            self.abort()
            raise OutputError(describe_os_error(exc, exc.filename or self.path,
                                                self.what)) from None
        self.committed = True
        self._staging = None
        self._release()
        return self.path

    def abort(self) -> None:
        """Discard the staging directory and release the lock (the target is untouched)."""
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it arose from, is a full disk or quota (libraries
    such as matplotlib or safetensors re-raise it under their own types)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(cur) or "os error 28" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
