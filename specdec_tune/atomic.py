"""Atomic file writes: readers see the old file or the new one, never a half-written one.

Every file specdec-tune writes goes through here: a temp file with an unpredictable name in the
same folder, fsync, rename, fsync of the folder. A new file gets the mode the umask allows (not
mkstemp's 0600); a replaced one keeps its mode. `locked` serialises read-modify-write and pairs of
writes across processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import SpecDecError
from .paths import cache_dir

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the writes stay atomic one by one
    fcntl = None  # type: ignore[assignment]


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write text so that readers see the old file or the new one, never a half-written one."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Temp file in the same folder + fsync + os.replace; parent folders are created.

    OS errors (permissions, full disk) become SpecDecError; the old file is left untouched.
    """
    path = Path(path)
    fd, tmp, mode = _temp_beside(path)
    # written through mkstemp's own descriptor, never reopened by name
    with _replacing(path, tmp), os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        os.fchmod(f.fileno(), mode)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temp file beside `path` (unpredictable name) for a writer that wants a file name (the GGUF
    writer); when the block ends without error it is fsynced and renamed over `path`, else removed.

    OS errors become SpecDecError; the old file is left untouched either way.
    """
    path = Path(path)
    fd, tmp, mode = _temp_beside(path)
    os.close(fd)
    with _replacing(path, tmp):
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _temp_beside(path: Path) -> tuple[int, str, int]:
    """(fd, name, mode to give it): mkstemp in `path`'s folder; the mode of the file it replaces,
    or for a new file what the umask allows (mkstemp's 0600 would hide a shared profile)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.stat().st_mode & 0o777 if path.exists() else new_file_mode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise SpecDecError(f"cannot write {path}: {e.strerror or e}") from None
    return fd, tmp, mode


@contextlib.contextmanager
def _replacing(path: Path, tmp: str) -> Iterator[None]:
    """Rename `tmp` over `path` when the block succeeds; remove it when it fails."""
    try:
        yield
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise SpecDecError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    _fsync_dir(path.parent)


def new_file_mode() -> int:
    """0o666 less the process umask: what open() would give a new file."""
    mask = os.umask(0o022)  # the only way to read it; set straight back
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive advisory lock for `path` across processes, held on a lock file in the cache
    folder named by a hash of `path`'s resolved location (created, never removed: removing it would
    let two writers hold two locks). Not beside `path`: a run would leave `.<name>.lock` files
    among a checkout's profiles, where `git status` shows them."""
    path = Path(path)
    if fcntl is None:
        yield
        return
    lock = lock_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        raise SpecDecError(f"cannot lock {path} ({lock}): {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def lock_file(path: Path) -> Path:
    """The lock file `locked(path)` holds: one per resolved path, so two spellings of one file
    (relative, absolute, through a symlinked folder) share one lock."""
    where = str(path.parent.resolve() / path.name)
    return cache_dir() / "locks" / f"{hashlib.sha256(where.encode()).hexdigest()[:24]}.lock"


def _fsync_dir(folder: Path) -> None:
    # makes the rename itself durable on POSIX; not possible (nor needed) on Windows
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
