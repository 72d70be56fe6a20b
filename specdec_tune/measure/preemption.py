"""How long this process's threads waited for a CPU, from the kernel's scheduler counters.

`/proc/self/task/<tid>/schedstat` holds, per thread, the nanoseconds it ran, the nanoseconds it sat
runnable on a run queue while another task had its CPU, and its time slices. The second number is
exactly "preempted": a thread that wanted to run and could not because other work held the core. It
does not count time a thread slept by itself (waiting for I/O or for a lock), so an idle helper
thread adds nothing. (PSI's `/proc/pressure/cpu` says it for the whole machine, not for our
threads: a hog on the other core raises it though our threads never wait, so it is not used.)

Why it matters (docs/ci.md, "Under load"): a decode step is a chain of short parallel operations,
each ending in a barrier where every thread of the pool waits for the slowest. When another process
holds one of our cores, the pool's thread there is descheduled for a time slice now and then, and
every barrier it misses waits for it; the draft's many tiny operations miss more of them than the
target's few large ones, so the load does not slow both sides alike and no tolerance separates it
from a regression (one core of two kept busy: 0.63-0.89x the stored speedup). Nor can the wait be
subtracted: on the shared 2-core VM (demo profile, stored speedup 2.14) a repeat whose threads
waited 8.4 s of 14.7 s read a speedup of 0.62, and 1.08 with the waits taken out, while the same
measurement's third repeat, which no load touched, read 2.10. What does hold: a prompt whose two sides' threads
never waited was timed as on a quiet machine, and both sides of one prompt run a fraction of a
second apart (timing.interleaved_parts). So `clean_ratios` keeps those pairs and rebuilds whole
repeats from them. Linux only; elsewhere every reading is None and nothing is corrected.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

PROC = Path("/proc")


def thread_waits(proc: Path = PROC, pid: int | None = None) -> dict[int, float] | None:
    """{thread id: seconds it has waited on a run queue so far} for every thread of this process
    (or of process `pid`, e.g. an engine's server); None where the kernel has no schedstat."""
    tasks = proc / str(pid or os.getpid()) / "task"
    out: dict[int, float] = {}
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return None
    for entry in entries:
        try:
            fields = (entry / "schedstat").read_text().split()
            out[int(entry.name)] = int(fields[1]) / 1e9
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return out or None


def waited_since(before: dict[int, float] | None, after: dict[int, float] | None) -> float:
    """The largest run-queue wait any one thread added from `before` to `after` (0 when unknown).

    The largest, not the sum: the threads of a pool wait at one barrier for the slowest, so the
    part's wall time grew by about the longest any of them was held off its CPU; two threads held
    off at the same moment delay the barrier once."""
    if not before or not after:
        return 0.0
    return max((t - before.get(tid, 0.0) for tid, t in after.items() if tid in before), default=0.0)


def watched(work: Callable[[], T], pid: int | None = None) -> tuple[T, float]:
    """Run `work()`: its result and the largest run-queue wait any thread of process `pid` (default
    this one; 0: none, e.g. a server not started by us) added meanwhile (0.0 where none is told)."""
    before = thread_waits(pid=pid) if pid != 0 else None
    result = work()
    return result, waited_since(before, thread_waits(pid=pid)) if before else 0.0


# per repeat, per part: (seconds, seconds waited for a CPU, units done: tokens, anchor steps)
PartLog = list[list[tuple[float, float, float]]]


def clean(part: tuple[float, float, float], max_wait_share: float) -> bool:
    """Whether other processes took (almost) nothing from a timed part: its threads waited for a
    CPU at most `max_wait_share` of its seconds."""
    seconds, waited, _ = part
    return seconds > 0 and waited <= max_wait_share * seconds


def clean_ratios(num: PartLog, den: PartLog, max_wait_share: float) -> tuple[list[float], float]:
    """The rate of side `num` over side `den` (e.g. speculative over plain tokens/s: the speedup)
    of every repeat that can be rebuilt from prompts neither side was preempted in, and the share of
    (repeat, prompt) pairs that were clean.

    Both sides ran prompt p of repeat r a fraction of a second apart (timing.interleaved_parts); a
    pair is clean when both of them were (`clean`). Rebuilt repeat j takes each prompt's j-th clean
    pair, so every rebuilt repeat covers the whole workload, as the stored speedup did, and as many
    are rebuilt as the prompt with the fewest clean pairs has. Worked example, 2 prompts, 3 repeats,
    prompt 1's pair of repeat 0 preempted: prompt 0 has 3 clean pairs, prompt 1 has 2, so 2 repeats
    are rebuilt (from prompt 0's repeats 0, 1 and prompt 1's repeats 1, 2) and the share is 5 / 6.
    Under a load that comes and goes (bursts) most pairs are clean and the verdict is the quiet
    machine's; under a load that never leaves our cores none is, and the check says so."""
    if not num or not den:
        return [], 0.0
    prompts = min(len(r) for r in num + den)
    pairs: list[list[tuple[tuple[float, float, float], tuple[float, float, float]]]] = []
    total = 0
    for p in range(prompts):
        pairs.append([(a[p], b[p]) for a, b in zip(num, den, strict=False)])
        total += len(pairs[-1])
    pairs = [
        [(a, b) for a, b in kept if clean(a, max_wait_share) and clean(b, max_wait_share)] for kept in pairs
    ]
    share = sum(map(len, pairs)) / total if total else 0.0
    out = []
    for j in range(min(map(len, pairs), default=0)):
        a_s = sum(kept[j][0][0] for kept in pairs)
        a_u = sum(kept[j][0][2] for kept in pairs)
        b_s = sum(kept[j][1][0] for kept in pairs)
        b_u = sum(kept[j][1][2] for kept in pairs)
        if a_s > 0 and b_s > 0 and b_u > 0:
            out.append((a_u / a_s) / (b_u / b_s))
    return out, share


def waited_share(*sides: PartLog) -> float:
    """The share of these parts' seconds in which our threads waited for a CPU (0 when untimed)."""
    seconds = sum(s for side in sides for rep in side for s, _, _ in rep)
    waited = sum(w for side in sides for rep in side for _, w, _ in rep)
    return waited / seconds if seconds > 0 else 0.0


def accounted(own: PartLog, plain: PartLog, max_wait_share: float) -> dict[str, float | list[float]]:
    """A Measurement's preemption fields of side `own` against `plain`: the clean speedups and their
    share (`clean_ratios`), and the waited share of both sides' seconds; {} where the kernel does
    not say how long threads waited (nothing is accounted, and `check` judges as before)."""
    if thread_waits() is None:
        return {}
    clean, share = clean_ratios(own, plain, max_wait_share)
    return {
        "clean_speedups": clean,
        "clean_share": round(share, 4),
        "waited_share": round(waited_share(own, plain), 4),
    }
