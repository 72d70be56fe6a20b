"""The one timer: synchronise the device, time, synchronise again; summaries as median and spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .hardware import synchronize


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Seconds `fn()` took on `device`, with queued device work drained before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - t0, result


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
