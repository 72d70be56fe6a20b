"""Machine anchors: how fast this machine is, independent of any model (copy bandwidth and a small
matmul rate), so `check` can tell a slower machine of the same slug from a slower target.

Both are cheap (about 0.2 s and 0.15 s on a 2-core CPU, far less on a GPU) and measured the same way
in `run` and in `check`. Other work on the machine only ever slows them, so where two measurements
exist the faster of each is kept (`faster`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..limits import check_count
from ..measurepolicy import MEASURE_POLICY, MeasurePolicy
from .timing import median, spread, time_repeated


@dataclass(frozen=True)
class MachineSpeed:
    """Medians of the policy's `anchor_repeats` samples each (measurepolicy), the larger relative
    spread (max - min) / median of the two, and the matmul's own (the anchor `check` decides by:
    output.anchors)."""

    copy_bandwidth_gbps: float
    matmul_gflops: float
    spread: float = 0.0
    matmul_spread: float = 0.0
    # measure_twice: how far the matmul rate moved from before the work to after it, relative to
    # the faster (the machine's own speed moving while it was measured: a shared host's neighbours)
    drift: float = 0.0


def measure_matmul_gflops(
    device: str, n: int | None = None, repeats: int | None = None, policy: MeasurePolicy = MEASURE_POLICY
) -> tuple[float, float]:
    """Float32 matmul rate 2n³ / time in GFLOP/s over blocks of calls: (median, relative spread).
    `n` and `repeats` default to the policy's anchor (`anchor_matmul_n(device)`, `anchor_repeats`)."""
    import torch

    from .forward import calls_per_block, no_gc, repeat_block

    repeats = policy.anchor_repeats if repeats is None else repeats
    check_count(repeats, "repeats")
    if n is None:
        n = policy.anchor_matmul_n(device)
    check_count(n, "n")
    with torch.inference_mode():
        g = torch.Generator().manual_seed(0)
        a = torch.rand(n, n, generator=g).to(device)
        b = torch.rand(n, n, generator=g).to(device)
        out = torch.empty(n, n, device=device)

        def one() -> None:
            torch.matmul(a, b, out=out)

        with no_gc():
            calls = calls_per_block(median(time_repeated(one, device, 3, warmup=1)))
            times_ms = time_repeated(repeat_block(one, calls), device, repeats, warmup=0)
    rates = [2 * n**3 * calls / (ms / 1e3) / 1e9 for ms in times_ms]
    return median(rates), spread(rates)


def machine_speed(device: str, policy: MeasurePolicy = MEASURE_POLICY) -> MachineSpeed:
    """This machine's anchors now: copy bandwidth (the policy's `anchor_copy_mib`) and the small
    matmul rate."""
    from .forward import measure_copy_bandwidth_gbps

    copy, copy_spread = measure_copy_bandwidth_gbps(
        device, mib=policy.anchor_copy_mib, repeats=policy.anchor_repeats
    )
    flops, flops_spread = measure_matmul_gflops(device, policy=policy)
    return MachineSpeed(
        round(copy, 3), round(flops, 3), round(max(copy_spread, flops_spread), 4), round(flops_spread, 4)
    )


def faster(a: MachineSpeed, b: MachineSpeed) -> MachineSpeed:
    """Per anchor the faster of two measurements (load only slows a machine), the smaller spread."""
    return MachineSpeed(
        max(a.copy_bandwidth_gbps, b.copy_bandwidth_gbps),
        max(a.matmul_gflops, b.matmul_gflops),
        min(a.spread, b.spread),
        min(a.matmul_spread, b.matmul_spread),
    )


def measure_twice(device: str, work: Callable[[], Any], settle_s: float = 0.0) -> tuple[MachineSpeed, Any]:
    """The anchors measured before and after `work()` (kept: the faster of each, with how far the
    matmul rate moved between them as `drift`), and its result. `settle_s`: waited before each, for
    an engine's processes that keep polling a core after their last request to let go of it (else
    the anchors time the engine, and their drift reads as a busy machine)."""
    if settle_s > 0:
        time.sleep(settle_s)
    before = machine_speed(device)
    result = work()
    if settle_s > 0:
        time.sleep(settle_s)
    after = machine_speed(device)
    both = faster(before, after)
    return dataclasses.replace(
        both, drift=round(drift([before.matmul_gflops, after.matmul_gflops]), 4)
    ), result


def drift(rates: list[float]) -> float:
    """(max - min) / max of some matmul rates (0 with fewer than two positive ones)."""
    good = [r for r in rates if r and r > 0]
    return (max(good) - min(good)) / max(good) if len(good) > 1 else 0.0
