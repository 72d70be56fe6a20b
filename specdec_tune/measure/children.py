"""Child processes that end with the command that started them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
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


# A guard process: it reads "+PGID" and "-PGID" lines, and when its input ends (this process exited,
# however: kill -9 and the OOM killer included) kills every group still listed. A parent-death
# signal reaches only a server's first process; an engine whose server starts processes of its own
# (vLLM: an engine core and its workers) left them running for ten minutes after its command was
# killed (stop 58), until they were killed by hand.
_GUARD = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "groups = set()\n"
    "for line in sys.stdin:\n"
    "    line = line.strip()\n"
    "    if line[:1] in '+-' and line[1:].isdigit():\n"
    "        (groups.add if line[0] == '+' else groups.discard)(int(line[1:]))\n"
    "for pgid in groups:\n"
    "    try:\n"
    "        os.killpg(pgid, signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
)
_guard: Any = None
_guard_pid: int | None = None  # the process that started it (a fork's child starts its own)
_guard_lock = threading.Lock()


def _tell_guard(line: str, start: bool = True) -> None:
    global _guard, _guard_pid
    if not sys.platform.startswith("linux"):
        return
    with _guard_lock:
        ours = _guard is not None and _guard_pid == os.getpid() and _guard.poll() is None
        if not ours and not start:  # nothing to forget: no guard of this process holds it
            return
        if not ours:
            _guard = subprocess.Popen(
                [sys.executable, "-c", _GUARD],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not in the terminal's group: a Ctrl-C reaches us, not it
                text=True,
            )
            _guard_pid = os.getpid()
        with contextlib.suppress(OSError, ValueError):
            _guard.stdin.write(line + "\n")
            _guard.stdin.flush()


def guard_group(pgid: int) -> None:
    """Kill process group `pgid` whenever this process ends without `release_group` first: the
    whole group, where a parent-death signal reaches only its first process."""
    _tell_guard(f"+{pgid}")


def release_group(pgid: int) -> None:
    """The group `pgid` is stopped (or stops itself): the guard forgets it."""
    _tell_guard(f"-{pgid}", start=False)
