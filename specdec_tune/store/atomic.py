"""Atomic file writes: readers see the old file or the new one, never a half-written one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..errors import SpecDecError


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write text so that readers see the old file or the new one, never a half-written one."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Temp file in the same folder + fsync + os.replace; parent folders are created.

    OS errors (permissions, full disk) become SpecDecError; the old file is left untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # keep the mode of the file we replace; mkstemp's 0600 would hide a shared profile
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise SpecDecError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise SpecDecError(f"cannot write {path}: {e.strerror or e}") from None
        raise
    _fsync_dir(path.parent)


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
