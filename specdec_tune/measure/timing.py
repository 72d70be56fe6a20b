"""The one timer and the interleaving primitives; summaries as median and spread.

`timed` synchronises the device before and after. `interleaved` runs several contenders once per
repeat, reversing the order on odd repeats (ABBA, generalised), so a slow drift of the machine
favours none of them; every comparison in the package (HF yardstick, loop overheads, forward-cost
curves, the batched replay) goes through it. `interleaved_parts` alternates prompt by prompt, for
load that changes faster than a pass: bench, and so the search, the final round and `check`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ..runtime.models.devices import synchronize
from .preemption import thread_waits, waited_since

K = TypeVar("K", bound=Hashable)


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Seconds `fn()` took on `device`, with queued device work drained before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - t0, result


def interleaved(
    runs: dict[K, Callable[[int], Any]],
    repeats: int,
    device: str,
    on_repeat: Callable[[int, dict[K, tuple[float, Any]]], None] | None = None,
) -> dict[K, list[tuple[float, Any]]]:
    """Time every run once per repeat, in dict order on even repeats and reversed on odd ones.

    `runs[k](r)` is called with the repeat index r (e.g. to vary a seed). Returns, per key, the
    (seconds, result) of each repeat. `on_repeat(r, this_repeat)` is called after each repeat and
    may raise to stop early (a tuner pruning a hopeless trial).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out: dict[K, list[tuple[float, Any]]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(repeats):
        for k in order if r % 2 == 0 else order[::-1]:
            out[k].append(timed(lambda k=k, r=r: runs[k](r), device))
        if on_repeat is not None:
            on_repeat(r, {k: v[-1] for k, v in out.items()})
    return out


def interleaved_parts(
    runs: dict[K, Callable[[int, int], Any]],
    repeats: int,
    parts: int,
    device: str,
    on_repeat: Callable[[int, dict[K, tuple[float, list[Any]]]], None] | None = None,
    log: dict[K, list[list[tuple[float, float]]]] | None = None,
) -> dict[K, list[tuple[float, list[Any]]]]:
    """`interleaved` with each repeat cut into `parts` (a workload's prompts): the contenders take
    turns part by part, the order reversed at every other part, and a repeat's seconds are the sum
    over its parts.

    Whole passes take seconds each, so load that comes and goes over seconds (another job's bursts)
    can land on one contender's pass and miss the next one's, and the ratio of the two is off by
    the burst. Part by part, the contenders of one part run a fraction of a second apart and share
    whatever the machine was doing. `runs[k](r, p)` runs part p of repeat r; returns, per key, the
    (seconds, [result per part]) of each repeat.

    `log`, when given, is filled per key, per repeat, per part with (seconds, seconds this
    process's threads sat on a run queue meanwhile: measure.preemption, the largest of any thread):
    which parts other processes took CPU time from (`preemption.clean_ratios` keeps the others).
    """
    if repeats < 1 or parts < 1:
        raise ValueError(f"repeats and parts must be >= 1, got {repeats} and {parts}")
    out: dict[K, list[tuple[float, list[Any]]]] = {k: [] for k in runs}
    order = list(runs)
    turn = 0
    for r in range(repeats):
        seconds = dict.fromkeys(runs, 0.0)
        logged: dict[K, list[tuple[float, float]]] = {k: [] for k in runs}
        results: dict[K, list[Any]] = {k: [] for k in runs}
        for p in range(parts):
            for k in order if turn % 2 == 0 else order[::-1]:
                before = thread_waits() if log is not None else None
                sec, res = timed(lambda k=k, r=r, p=p: runs[k](r, p), device)
                logged[k].append((sec, min(sec, waited_since(before, thread_waits())) if before else 0.0))
                seconds[k] += sec
                results[k].append(res)
            turn += 1
        for k in runs:
            out[k].append((seconds[k], results[k]))
            if log is not None:
                log.setdefault(k, []).append(logged[k])
        if on_repeat is not None:
            on_repeat(r, {k: v[-1] for k, v in out.items()})
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> float:
    """Relative spread (max - min) / median: 0.05 means the repeats agree within 5%."""
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return (max(values) - min(values)) / m if m else 0.0


def time_repeated(fn: Callable[[], Any], device: str, repeats: int, warmup: int = 1) -> list[float]:
    """Per-call milliseconds of `fn` over `repeats` timed calls after `warmup` untimed ones.

    On CUDA each call is bracketed by events, which time the device work, not the launch.
    """
    for _ in range(warmup):
        fn()
    if str(device).startswith("cuda"):
        import torch

        out = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return out
    return [timed(fn, device)[0] * 1e3 for _ in range(repeats)]
