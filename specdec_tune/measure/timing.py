"""The one timer and the one interleaving primitive; summaries as median and spread.

`timed` synchronises the device before and after. `interleaved` runs several contenders once per
repeat, reversing the order on odd repeats (ABBA, generalised), so a slow drift of the machine
favours none of them; every comparison in the package (bench, final round, HF yardstick, loop
overheads, forward-cost curves) goes through it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ..runtime.models.devices import synchronize

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
