"""The check slice: one engine thread on one core that no other process is using, for the
measurements `check` judges and the reference `run` stores for it (app.reference).

Why: a CI runner is a shared machine. An engine with a thread on every core waits, at every step,
for the thread whose core another process holds (a chain of short parallel operations, each ending
in a barrier), and the draft's many small operations lose more to that than the target's few large
ones: with a busy loop on one of the 2-core VM's cores, 2-thread checks of an unchanged setup read
0.63-0.89x the stored speedup and answered "cannot tell" 20 times of 20. One thread pinned to the
other core does not wait for anything: the same config read 2.02, 2.03 and 2.00x beside the busy
loop and 1.96, 2.03 and 2.02x without it (repeats within 2-5 %, stop 59). The check therefore
measures on a slice of the machine that the load leaves alone, against a reference measured on
such a slice; the slice is the same on a quiet machine, so quiet and loaded checks are one path.

Linux only (sched_setaffinity, /proc/stat per CPU); elsewhere `take` returns None and the caller
measures as it did before.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SLICE_THREADS = 1  # engine threads in the check slice
WATCH_S = 0.3  # how long each core's load is watched before one is chosen


@dataclass(frozen=True)
class Slice:
    """Where this process measures: `core`, with `threads` engine threads; `threads_before`: what
    the engine would have had without the slice (torch's threads then), which the hardware slug
    names; `cores_before`: the cores it was allowed before (`release` gives them back)."""

    core: int
    threads: int
    threads_before: int
    cores_before: frozenset[int] = frozenset()


def core_busy(proc: Path = PROC) -> dict[int, tuple[float, float, float]]:
    """{cpu: (all jiffies, busy jiffies, steal jiffies)} per CPU from /proc/stat's `cpuN` lines
    (busy: every state but idle, iowait and steal); {} where unreadable."""
    out: dict[int, tuple[float, float, float]] = {}
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        v = [float(x) for x in rest.split()] + [0.0] * 8
        out[int(name[3:])] = (sum(v[:8]), v[0] + v[1] + v[2] + v[5] + v[6], v[7])
    return out


def freest(
    before: dict[int, tuple[float, float, float]],
    after: dict[int, tuple[float, float, float]],
    allowed: set[int],
) -> int | None:
    """The allowed CPU that was busy the least between two `core_busy` readings (the lowest
    number among equals); None where none was read at both ends."""
    shares = {}
    for cpu in sorted(allowed):
        if cpu in before and cpu in after and after[cpu][0] > before[cpu][0]:
            shares[cpu] = (after[cpu][1] - before[cpu][1]) / (after[cpu][0] - before[cpu][0])
    return min(shares, key=lambda c: (shares[c], c)) if shares else None


def pin_all_threads(core: int, proc: Path = PROC) -> None:
    """Every thread of this process on `core` (sched_setaffinity of pid 0 moves the calling thread
    only; threads started later inherit it)."""
    tids = (
        [int(t.name) for t in (proc / "self" / "task").iterdir()]
        if (proc / "self" / "task").is_dir()
        else [0]
    )
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, {core})


def _threads(proc: Path = PROC) -> list[int]:
    """This process's thread ids (0, the calling thread, where /proc cannot list them)."""
    tasks = proc / "self" / "task"
    return [int(t.name) for t in tasks.iterdir() if t.name.isdigit()] if tasks.is_dir() else [0]


def take(watch_s: float = WATCH_S, proc: Path = PROC) -> Slice | None:
    """Move this process to the check slice: the core of its allowed ones that other processes used
    the least over `watch_s`, with SLICE_THREADS torch threads. None (nothing changed) where the OS
    cannot pin or only one core is allowed, where the slice is the whole machine anyway."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = set(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    before = core_busy(proc)
    time.sleep(watch_s)
    core = freest(before, core_busy(proc), allowed)
    if core is None:
        return None
    import torch

    threads_before = torch.get_num_threads()
    pin_all_threads(core, proc)
    torch.set_num_threads(SLICE_THREADS)
    return Slice(core, SLICE_THREADS, threads_before, frozenset(allowed))


def release(where: Slice, proc: Path = PROC) -> None:
    """This process back on every core it had before `take`, with its threads then."""
    import torch

    for tid in _threads(proc):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, set(where.cores_before))
    torch.set_num_threads(where.threads_before)


def pinned_core() -> int | None:
    """The one core this process runs on, where it is pinned to one of several (`take`), else None."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = os.sched_getaffinity(0)
    return next(iter(cores)) if len(cores) == 1 and (os.cpu_count() or 1) > 1 else None
