"""One config at concurrency B against plain batched decoding at the same B, timed in one run.

Both sides run the closed loop of `runtime.batch` (B requests in flight, a finished row refilled
from the workload queue) over the whole workload, interleaved (`timing.interleaved`) after a
warm-up. Speedup(B) is the median over repeats of the speculative tokens/s over the plain
tokens/s of the same repeat. Also reported: per-request latency (median, p90) and peak memory
(the process's peak RSS on CPU, max allocated on CUDA) of each side.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..domain import Metrics
from ..limits import check_count, check_decoding
from ..runtime.batch import BatchDrafter, BatchRun, batch_generate
from ..runtime.engine import SpecStats
from ..runtime.workloads import Case
from .timing import interleaved, median, spread


@dataclass
class ServingSide:
    """One side (speculative or plain) at batch size B."""

    tokens_per_s: float
    latency_ms_p50: float
    latency_ms_p90: float
    peak_memory_mb: float | None


@dataclass
class BatchMeasurement:
    batch_size: int
    metrics: Metrics  # speedup and acceptance of the config at this batch size
    speculative: ServingSide
    plain: ServingSide
    mismatches: int  # greedy only: prompts whose output differs from plain batched decoding
    speedups: list[float] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    outputs: list[list[int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            **self.metrics.as_dict(),
            "speculative": vars(self.speculative),
            "plain": vars(self.plain),
            "mismatches": self.mismatches,
            "speedups": list(self.speedups),
        }


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


@contextlib.contextmanager
def peak_memory(device: str, out: list[float | None]) -> Iterator[None]:
    """Appends the peak memory in MB reached inside the block (None where it cannot be read)."""
    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
        yield
        out.append(torch.cuda.max_memory_allocated(device) / 2**20)
        return
    reset = False
    with contextlib.suppress(OSError):
        # Linux: "5" resets the peak resident set size (VmHWM) of this process.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    yield
    out.append(_vm_hwm_mb() if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _vm_hwm_mb() -> float | None:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def measure_batched(
    target: Any,
    make_drafter: Callable[[], BatchDrafter | None],
    gamma: int,
    threshold: float,
    case: Case,
    batch_size: int,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
) -> BatchMeasurement:
    """Time `case` at concurrency `batch_size` with the config and with plain batched decoding."""
    check_count(batch_size, "batch size")
    check_count(repeats, "repeats")
    check_decoding(gamma, threshold, case.temperature, min(case.max_new_tokens))
    device = str(next(target.parameters()).device)
    drafter = make_drafter() if gamma > 0 else None
    memory: dict[str, list[float | None]] = {"plain": [], "spec": []}

    def side(name: str, d: BatchDrafter | None, g: int) -> Callable[[int], BatchRun]:
        def run(r: int) -> BatchRun:
            with peak_memory(device, memory[name]):
                return batch_generate(target, d, case, batch_size, g, threshold, seed + r)

        return run

    runs = {"plain": side("plain", None, 0), "spec": side("spec", drafter, gamma)}
    warm = case.head(min(len(case.prompts), batch_size))
    for _ in range(warmup):
        batch_generate(target, None, warm, batch_size, 0, 0.0, seed)
        if drafter is not None:
            batch_generate(target, drafter, warm, batch_size, gamma, threshold, seed)
    timings = interleaved(runs, repeats, device)

    def rates(name: str) -> list[float]:
        return [sum(map(len, run.outputs)) / sec for sec, run in timings[name]]

    ratios = [s / p for s, p in zip(rates("spec"), rates("plain"), strict=True)]
    stats = SpecStats()
    for _, run in timings["spec"]:
        stats.add(run.stats)
    spec_out = timings["spec"][-1][1].outputs
    plain_out = timings["plain"][-1][1].outputs
    mismatches = sum(a != b for a, b in zip(spec_out, plain_out, strict=True)) if case.temperature == 0 else 0
    speculative = gamma > 0
    metrics = Metrics(
        tokens_per_s=median(rates("spec")),
        baseline_tokens_per_s=median(rates("plain")),
        speedup=median(ratios),
        speedup_spread=spread(ratios),
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_len=stats.mean_accepted_len if speculative else 1.0,
        per_position_acceptance=stats.per_position_acceptance,
        repeats=repeats,
    )
    return BatchMeasurement(
        batch_size=batch_size,
        metrics=metrics,
        speculative=_side(timings["spec"], rates("spec"), memory["spec"]),
        plain=_side(timings["plain"], rates("plain"), memory["plain"]),
        mismatches=mismatches,
        speedups=ratios,
        stats=stats,
        outputs=spec_out,
    )


def _side(
    timed_runs: list[tuple[float, BatchRun]], rates: list[float], memory: list[float | None]
) -> ServingSide:
    latencies = [s * 1e3 for _, run in timed_runs for s in run.latencies_s]
    peaks = [m for m in memory if m is not None]
    return ServingSide(
        tokens_per_s=median(rates),
        latency_ms_p50=percentile(latencies, 0.5),
        latency_ms_p90=percentile(latencies, 0.9),
        peak_memory_mb=max(peaks) if peaks else None,
    )
