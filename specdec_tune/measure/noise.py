"""How noisy this machine is while we measure: what the OS says (load average, steal time, the CPU
other processes took over the window) and the spread of repeated plain passes, and how many
interleaved repeats that noise needs before a difference of `RESOLVE_SHARE` can be told apart.

Linux /proc only; elsewhere the OS part is left empty and the passes' spread decides alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..domain import MachineWindow, Noise

PROC = Path("/proc")
RESOLVE_SHARE = 0.05  # the smallest speedup difference the repeats should resolve
# Beyond these the OS says the machine is busy: other processes' share of all CPUs, steal's share.
BUSY_OTHERS = 0.25
BUSY_STEAL = 0.10


def cpu_times(proc: Path = PROC) -> tuple[float, float] | None:
    """(all jiffies, steal jiffies) summed over CPUs, from /proc/stat's first line."""
    try:
        fields = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [float(x) for x in fields[1:]]
    steal = values[7] if len(values) > 7 else 0.0
    # guest time is already counted in user time
    return sum(values[:8]), steal


def process_ticks(proc: Path = PROC, exclude: set[int] | None = None) -> dict[int, tuple[str, float]]:
    """{pid: (name, user + system jiffies)} of every process but `exclude` and their children."""
    exclude = exclude if exclude is not None else {os.getpid()}
    out: dict[int, tuple[str, float]] = {}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        rest = text[text.rfind(")") + 2 :].split()
        pid, ppid = int(entry.name), int(rest[1])
        if pid in exclude or ppid in exclude:
            continue
        out[pid] = (name, float(rest[11]) + float(rest[12]))
    return out


def os_snapshot(proc: Path = PROC) -> tuple[Any, dict[int, tuple[str, float]], float]:
    """Where the OS's counters stand now (CPU jiffies, every other process's ticks, the clock), for
    `os_since` to tell what else the machine did from here on."""
    return cpu_times(proc), process_ticks(proc), time.monotonic()


def os_since(
    snapshot: tuple[Any, dict[int, tuple[str, float]], float], proc: Path = PROC, cpus: int | None = None
) -> dict[str, Any]:
    """What else the machine did since `snapshot` (os_snapshot): {load_avg, steal_share,
    others_cpu_share, busiest} (None where /proc cannot tell)."""
    before_cpu, before_procs, _ = snapshot
    after_cpu, after_procs = cpu_times(proc), process_ticks(proc)
    info: dict[str, Any] = {"load_avg": None, "steal_share": None, "others_cpu_share": None, "busiest": []}
    with contextlib.suppress(OSError, IndexError, ValueError):
        info["load_avg"] = float((proc / "loadavg").read_text().split()[0])
    if before_cpu and after_cpu and after_cpu[0] > before_cpu[0]:
        total = after_cpu[0] - before_cpu[0]  # jiffies over all CPUs
        info["steal_share"] = round((after_cpu[1] - before_cpu[1]) / total, 4)
        used = {
            pid: (name, ticks - before_procs[pid][1])
            for pid, (name, ticks) in after_procs.items()
            if pid in before_procs and ticks > before_procs[pid][1]
        }
        info["others_cpu_share"] = round(min(1.0, sum(t for _, t in used.values()) / total), 4)
        top = sorted(used.items(), key=lambda kv: -kv[1][1])[:3]
        n = cpus or os.cpu_count() or 1
        info["busiest"] = [f"{name} ({pid}) {t / total * n:.0%} of a CPU" for pid, (name, t) in top]
    return info


def os_window(
    work: Callable[[], Any], proc: Path = PROC, cpus: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """Run `work()` and say what else the machine did meanwhile (os_since)."""
    snapshot = os_snapshot(proc)
    result = work()
    return result, os_since(snapshot, proc, cpus)


def machine_window(
    snapshot: tuple[Any, dict[int, tuple[str, float]], float], proc: Path = PROC
) -> MachineWindow:
    """What the OS said from `snapshot` (os_snapshot) until now, e.g. over a whole search."""
    info = os_since(snapshot, proc)
    return MachineWindow(round(time.monotonic() - snapshot[2], 1), busy=busy_info(info), **info)


def busy_info(info: dict[str, Any]) -> bool:
    """Whether what the OS said (os_since) is a busy machine: other processes over BUSY_OTHERS of
    all CPUs, or the hypervisor's steal over BUSY_STEAL."""
    return (info.get("others_cpu_share") or 0.0) > BUSY_OTHERS or (
        info.get("steal_share") or 0.0
    ) > BUSY_STEAL


def during_line(window: MachineWindow) -> str:
    """One line for the user when the machine turned busy during the search ("" otherwise)."""
    if not window.busy:
        return ""
    parts = [f"other processes {window.others_cpu_share or 0.0:.0%} of all CPUs"]
    if window.steal_share:
        parts.append(f"steal {window.steal_share:.0%}")
    if window.busiest:
        parts.append(f"busiest: {window.busiest[0]}")
    return (
        f"the machine turned busy during the search ({', '.join(parts)} over {window.seconds:.0f} s): "
        "the final round's numbers carry that load; re-run on a quiet machine for numbers to keep"
    )


def repeats_needed(cv: float, resolve: float = RESOLVE_SHARE) -> int:
    """Interleaved repeats for the interval of a paired ratio to be narrower than `resolve` when
    each pass varies by `cv` (coefficient of variation): a ratio of two passes varies by about
    sqrt(2) cv, and a 95 % interval of n of them spans about 2 x 1.96 sqrt(2) cv / sqrt(n)."""
    if not cv > 0:
        return 1
    return max(1, math.ceil((2 * 1.96 * math.sqrt(2) * cv / resolve) ** 2))


def measure_noise(plain_pass: Callable[[], float], passes: int = 3, proc: Path = PROC) -> Noise:
    """Time `passes` plain passes (`plain_pass()` returns its seconds) while watching the OS."""
    seconds, info = os_window(lambda: [plain_pass() for _ in range(passes)], proc)
    mean = statistics.fmean(seconds)
    cv = statistics.stdev(seconds) / mean if len(seconds) > 1 and mean > 0 else 0.0
    return Noise(
        plain_pass_s=round(statistics.median(seconds), 5),
        plain_pass_cv=round(cv, 4),
        plain_passes=len(seconds),
        cpus=os.cpu_count() or 1,
        load_avg=info["load_avg"],
        steal_share=info["steal_share"],
        others_cpu_share=info["others_cpu_share"],
        busiest=info["busiest"],
        repeats_needed=repeats_needed(cv),
    )


def busy(noise: Noise) -> bool:
    """The OS says other work shares this machine (other processes' CPU, or the hypervisor's steal)."""
    return busy_info({"others_cpu_share": noise.others_cpu_share, "steal_share": noise.steal_share})


def noise_line(noise: Noise, repeats: int) -> str:
    """One line for the user when the noise is above what `repeats` can resolve; "" otherwise."""
    if noise.repeats_needed <= repeats and not busy(noise):
        return ""
    os_part = [f"load {noise.load_avg:.1f} on {noise.cpus} CPUs"] if noise.load_avg is not None else []
    if noise.others_cpu_share is not None:
        os_part.append(f"other processes {noise.others_cpu_share:.0%} of all CPUs")
    if noise.steal_share:
        os_part.append(f"steal {noise.steal_share:.0%}")
    head = (
        "noisy machine"
        if noise.repeats_needed > repeats
        else "busy machine (numbers may move as the load does)"
    )
    return (
        f"{head}: plain passes vary {noise.plain_pass_cv:.1%} ({', '.join(os_part) or 'OS: unknown'}); "
        f"resolving {RESOLVE_SHARE:.0%} needs about {noise.repeats_needed} interleaved repeats, "
        f"{repeats} planned"
    )


def busy_window(work: Callable[[], Any], proc: Path = PROC) -> tuple[Any, dict[str, Any], bool]:
    """Run `work()`: its result, what the OS said meanwhile, and whether that says busy."""
    result, info = os_window(work, proc)
    return result, info, busy_info(info)
