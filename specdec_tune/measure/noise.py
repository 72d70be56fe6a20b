"""How noisy this machine is while we measure: what the OS says (load average, steal time, the CPU
other processes took over the window) and the spread of repeated plain passes, and how many
interleaved repeats that noise needs before a difference of the policy's `resolve_share` can be told
apart (measurepolicy).

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

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..domain import MachineWindow, Noise
from ..measurepolicy import MEASURE_POLICY, MeasurePolicy
from . import narrow

PROC = Path("/proc")


def cpu_times(proc: Path = PROC) -> tuple[float, float, float] | None:
    """(all jiffies, steal jiffies, busy jiffies) summed over CPUs, from /proc/stat's first line;
    busy is every state but idle, iowait and steal (user, nice, system, irq, softirq)."""
    try:
        fields = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [float(x) for x in fields[1:]] + [0.0] * 8
    # guest time is already counted in user time
    return sum(values[:8]), values[7], values[0] + values[1] + values[2] + values[5] + values[6]


def own_ticks(proc: Path = PROC) -> float | None:
    """This process's user + system jiffies, its waited-for children's included (None: unreadable)."""
    try:
        text = (proc / str(os.getpid()) / "stat").read_text()
        rest = text[text.rfind(")") + 2 :].split()
        return sum(float(x) for x in rest[11:15])  # utime stime cutime cstime
    except (OSError, IndexError, ValueError):
        return None


def process_ticks(
    proc: Path = PROC, exclude: set[int] | None = None, excluded: dict[int, float] | None = None
) -> dict[int, tuple[str, float]]:
    """{pid: (name, user + system jiffies)} of every process but `exclude` and their descendants
    (a server we started, a compile worker's workers); the descendants' jiffies go to `excluded`
    when given."""
    exclude = exclude if exclude is not None else {os.getpid()}
    seen: dict[int, tuple[str, int, float]] = {}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        rest = text[text.rfind(")") + 2 :].split()
        seen[int(entry.name)] = (name, int(rest[1]), float(rest[11]) + float(rest[12]))
    ours = set(exclude)
    grown = True
    while grown:  # descendants: a few passes for a few generations
        kids = {pid for pid, (_, ppid, _) in seen.items() if ppid in ours and pid not in ours}
        ours |= kids
        grown = bool(kids)
    if excluded is not None:
        excluded.update({pid: t for pid, (_, _, t) in seen.items() if pid in ours and pid not in exclude})
    return {pid: (name, t) for pid, (name, _, t) in seen.items() if pid not in ours}


Snapshot = tuple[Any, dict[int, tuple[str, float]], float, Any, Any]


def os_snapshot(proc: Path = PROC) -> Snapshot:
    """Where the OS's counters stand now (CPU jiffies, every other process's ticks, the clock, and
    what this process and its children used), for `os_since` to tell what else the machine did."""
    children: dict[int, float] = {}
    procs = process_ticks(proc, excluded=children)
    core = narrow.pinned_core() if proc == PROC else None
    at_core = (core, narrow.core_busy(proc).get(core)) if core is not None else None
    return cpu_times(proc), procs, time.monotonic(), (own_ticks(proc), children), at_core


def unaccounted_share(before: Any, after: Any, before_cpu: Any, after_cpu: Any, total: float) -> float:
    """The busy share of all CPUs that neither this process and its children nor any process seen
    at both ends of the window used: processes that started and ended inside it (a test run, a
    compiler, a `--help` that imports torch), which a per-process count never sees. 0 where this
    process's own jiffies could not be read."""
    (own_before, kids_before), (own_after, kids_after) = before, after
    if own_before is None or own_after is None or len(before_cpu) < 3 or len(after_cpu) < 3:
        return 0.0
    ours = own_after - own_before
    ours += sum(t - kids_before.get(pid, 0.0) for pid, t in kids_after.items())
    return max(0.0, (after_cpu[2] - before_cpu[2] - ours) / total)


def os_since(
    snapshot: Snapshot, proc: Path = PROC, cpus: int | None = None, policy: MeasurePolicy = MEASURE_POLICY
) -> dict[str, Any]:
    """What else the machine did since `snapshot` (os_snapshot): {load_avg, steal_share,
    others_cpu_share, busiest} (None where /proc cannot tell). Other processes' share is the larger
    of what the processes alive at both ends used and the busy time nothing of ours used (which
    also holds the processes that came and went meanwhile); that busy time is named in `busiest`
    as short-lived processes beyond the policy's `unseen_note_share`."""
    before_cpu, before_procs, _, before_ours, at_core = snapshot
    children: dict[int, float] = {}
    after_cpu, after_procs = cpu_times(proc), process_ticks(proc, excluded=children)
    after_ours = (own_ticks(proc), children)
    if at_core is not None and at_core[1] is not None:
        return on_core(at_core, before_ours, after_ours, before_procs, after_procs, proc)
    info = _empty_info(proc)
    if before_cpu and after_cpu and after_cpu[0] > before_cpu[0]:
        total = after_cpu[0] - before_cpu[0]  # jiffies over all CPUs
        info["steal_share"] = round((after_cpu[1] - before_cpu[1]) / total, 4)
        used = _used(before_procs, after_procs)
        seen = sum(t for _, t in used.values()) / total
        gone = unaccounted_share(before_ours, after_ours, before_cpu, after_cpu, total)
        info["others_cpu_share"] = round(min(1.0, max(seen, gone)), 4)
        n = cpus or os.cpu_count() or 1
        info["busiest"] = _busiest(used, total / n)
        if gone > seen + policy.unseen_note_share:
            info["busiest"].insert(0, f"short-lived processes {(gone - seen) * n:.0%} of a CPU")
    return info


def on_core(
    at_core: tuple[int, tuple[float, float, float]],
    before_ours: Any,
    after_ours: Any,
    before_procs: dict[int, tuple[str, float]],
    after_procs: dict[int, tuple[str, float]],
    proc: Path = PROC,
) -> dict[str, Any]:
    """`os_since` for a process pinned to one core (measure.narrow): the machine is that core. Other
    processes' share is its busy time that neither this process nor its children used (they run
    there only), steal its own; what other cores do never reaches a pinned single-thread engine, and
    is not counted. `core` says which; `busiest` names the machine's busiest others, wherever."""
    core, (all_before, busy_before, steal_before) = at_core
    after = narrow.core_busy(proc).get(core)
    info = {**_empty_info(proc), "core": core}
    (own_before, kids_before), (own_after, kids_after) = before_ours, after_ours
    if after is None or after[0] <= all_before or own_before is None or own_after is None:
        return info
    total = after[0] - all_before
    ours = own_after - own_before + sum(t - kids_before.get(pid, 0.0) for pid, t in kids_after.items())
    info["others_cpu_share"] = round(min(1.0, max(0.0, (after[1] - busy_before - ours) / total)), 4)
    info["steal_share"] = round((after[2] - steal_before) / total, 4)
    info["busiest"] = _busiest(_used(before_procs, after_procs), total)
    return info


def _empty_info(proc: Path) -> dict[str, Any]:
    """`os_since`'s fields with only the load average read (None where /proc cannot tell)."""
    info: dict[str, Any] = {"load_avg": None, "steal_share": None, "others_cpu_share": None, "busiest": []}
    with contextlib.suppress(OSError, IndexError, ValueError):
        info["load_avg"] = float((proc / "loadavg").read_text().split()[0])
    return info


def _used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[int, tuple[str, float]]:
    """{pid: (name, jiffies)} each process alive at both ends used in between."""
    return {
        pid: (name, t - before[pid][1])
        for pid, (name, t) in after.items()
        if pid in before and t > before[pid][1]
    }


def _busiest(used: dict[int, tuple[str, float]], per_cpu: float) -> list[str]:
    """The three processes that used the most, as shares of one CPU's `per_cpu` jiffies."""
    top = sorted(used.items(), key=lambda kv: -kv[1][1])[:3]
    return [f"{name} ({pid}) {t / per_cpu:.0%} of a CPU" for pid, (name, t) in top]


def os_window(
    work: Callable[[], Any], proc: Path = PROC, cpus: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """Run `work()` and say what else the machine did meanwhile (os_since)."""
    snapshot = os_snapshot(proc)
    result = work()
    return result, os_since(snapshot, proc, cpus)


def machine_window(
    snapshot: Snapshot, proc: Path = PROC, rule: Callable[[dict[str, Any]], bool] | None = None
) -> MachineWindow:
    """What the OS said from `snapshot` (os_snapshot) until now, e.g. over a whole search; busy by
    `rule` (default `busy_info`; an engine with its threads on every core has a stricter one)."""
    info = os_since(snapshot, proc)
    busy = (rule or busy_info)(info)
    info.pop("core", None)
    return MachineWindow(round(time.monotonic() - snapshot[2], 1), busy=busy, **info)


def busy_info(
    info: dict[str, Any],
    policy: CheckPolicy = CHECK_POLICY,
    *,
    threads: int | None = None,
    cpus: int | None = None,
) -> bool:
    """Whether what the OS said (os_since) is a busy machine by `policy` (checkpolicy): other
    processes over `busy_others_share` of all CPUs, or the hypervisor's steal over
    `busy_steal_share`; where the policy has `busy_beyond_free_cores_share` (an engine whose
    `threads` wait for each other, e.g. llama.cpp), also other processes taking more than the
    cores those threads leave free plus that share of all `cpus`. Shares said of one core (`core`
    in `info`: a process pinned there, measure.narrow) are judged as of a one-CPU machine."""
    others = info.get("others_cpu_share") or 0.0
    if others > policy.busy_others_share or (info.get("steal_share") or 0.0) > policy.busy_steal_share:
        return True
    if policy.busy_beyond_free_cores_share is None:
        return False
    if info.get("core") is not None:  # pinned to one core (measure.narrow): that core is the machine
        cpus = threads = 1
    n = cpus or os.cpu_count() or 1
    free = max(0, n - (threads or n))
    return others * n > free + policy.busy_beyond_free_cores_share * n


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


def repeats_needed(cv: float, resolve: float | None = None, policy: MeasurePolicy = MEASURE_POLICY) -> int:
    """Interleaved repeats for the interval of a paired ratio to be narrower than `resolve` (by
    default the policy's `resolve_share`) when each pass varies by `cv` (coefficient of variation):
    a ratio of two passes varies by about sqrt(2) cv, and a 95 % interval of n of them spans about
    2 z sqrt(2) cv / sqrt(n), z the policy's `interval_z` (1.96)."""
    resolve = policy.resolve_share if resolve is None else resolve
    if not cv > 0:
        return 1
    return max(1, math.ceil((2 * policy.interval_z * math.sqrt(2) * cv / resolve) ** 2))


def measure_noise(
    plain_pass: Callable[[], float],
    passes: int = 3,
    proc: Path = PROC,
    policy: MeasurePolicy = MEASURE_POLICY,
) -> Noise:
    """Time `passes` plain passes (`plain_pass()` returns its seconds) while watching the OS; the
    repeats they need resolve the policy's `resolve_share`."""
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
        repeats_needed=repeats_needed(cv, policy=policy),
    )


def busy(noise: Noise) -> bool:
    """The OS says other work shares this machine (other processes' CPU, or the hypervisor's steal)."""
    return busy_info({"others_cpu_share": noise.others_cpu_share, "steal_share": noise.steal_share})


def noise_line(noise: Noise, repeats: int, policy: MeasurePolicy = MEASURE_POLICY) -> str:
    """One line for the user when the noise is above what `repeats` can resolve (the policy's
    `resolve_share`, as `measure_noise` counted the repeats needed); "" otherwise."""
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
        f"resolving {policy.resolve_share:.0%} needs about {noise.repeats_needed} interleaved repeats, "
        f"{repeats} planned"
    )


def busy_window(work: Callable[[], Any], proc: Path = PROC) -> tuple[Any, dict[str, Any], bool]:
    """Run `work()`: its result, what the OS said meanwhile, and whether that says busy."""
    result, info = os_window(work, proc)
    return result, info, busy_info(info)
