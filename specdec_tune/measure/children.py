"""Child processes that end with the command that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _resolve_prctl() -> Any:
    """libc's prctl, looked up here in the parent: between fork and exec a child of a threaded
    process must not dlopen (another thread may have held the loader's lock at the fork)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _resolve_prctl()


def die_with_parent() -> None:
    """Called in a child (as a `preexec_fn`, between fork and exec, or first thing in the child): it
    is killed when its parent dies, on Linux, so a killed command leaves no server, worker or
    measuring process behind; elsewhere it does nothing."""
    if _PRCTL is not None:
        with contextlib.suppress(Exception):
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
