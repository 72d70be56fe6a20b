"""One config at concurrency B against plain batched decoding at the same B, timed in one run.

Both sides run the closed loop of `runtime.batch` (B requests in flight, a finished row refilled
from the workload queue) over the whole workload, interleaved (`timing.interleaved`) after a
warm-up. Throughput is the steady state's: tokens/s while all B slots were busy (until the queue
ran dry), so the drain at the end, with fewer requests in flight, does not dilute it. Speedup(B)
is the median over repeats of the speculative tokens/s over the plain tokens/s of the same repeat. Also reported: per-request latency (median, p90) and peak memory
(the process's peak RSS on CPU, max allocated on CUDA) of each side.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..limits import check_count, check_decoding
from ..measurement import Measurement
from ..runtime.batch import BatchDrafter, BatchRun, batch_generate
from ..runtime.caches.modes import ExecutionContext
from ..runtime.decode import SpecStats
from ..runtime.drafting.hybrid import reset_sources, source_stats
from ..runtime.graphs import GraphBuild, Untimed, prebuild, timed_without_compiles
from ..runtime.workloads import Case
from .paired import RepeatRatios, mismatches, paired_metrics
from .timing import interleaved, median

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class ServingSide:
    """One side (speculative or plain) at batch size B."""

    tokens_per_s: float
    latency_ms_p50: float
    latency_ms_p90: float
    peak_memory_mb: float | None


@dataclass(kw_only=True)
class BatchMeasurement(Measurement):
    """A config at batch size B: a `Measurement` (metrics of the config at B, per-repeat speedups,
    the loop's counters, compile work) and both serving sides' throughput, latency and memory."""

    batch_size: int
    speculative: ServingSide
    plain: ServingSide

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            **self.metrics.as_dict(),
            "speculative": vars(self.speculative),
            "plain": vars(self.plain),
            "mismatches": self.mismatches,
            "speedups": list(self.speedups),
            "compile": (self.build or GraphBuild()).as_dict(),
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


@dataclass
class BatchEntry:
    """One config to time at batch size B: a factory for its batched drafter, gamma, threshold."""

    make_drafter: Callable[[], BatchDrafter | None]
    gamma: int
    threshold: float = 0.0


def measure_batched(
    target: PreTrainedModel,
    make_drafter: Callable[[], BatchDrafter | None],
    gamma: int,
    threshold: float,
    case: Case,
    batch_size: int,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    on_repeat: Callable[[int, float], None] | None = None,
    ctx: ExecutionContext | None = None,
) -> BatchMeasurement:
    """Time `case` at concurrency `batch_size` with the config and with plain batched decoding."""
    hook = None if on_repeat is None else (lambda r, speedups: on_repeat(r, speedups[0]))
    entry = BatchEntry(make_drafter, gamma, threshold)
    return measure_batched_many(target, [entry], case, batch_size, repeats, warmup, seed, hook, ctx)[0]


def measure_batched_many(
    target: PreTrainedModel,
    entries: list[BatchEntry],
    case: Case,
    batch_size: int,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    on_repeat: Callable[[int, list[float]], None] | None = None,
    ctx: ExecutionContext | None = None,
) -> list[BatchMeasurement]:
    """Several configs and plain batched decoding at concurrency `batch_size`, in one interleaved
    run: one BatchMeasurement each (the batched counterpart of `bench.measure_many`). A case of
    fewer prompts than `batch_size` is cycled to `batch_size` requests (`fill_slots`)."""
    check_count(batch_size, "batch size")
    check_count(repeats, "repeats")
    case = fill_slots(case, batch_size)
    if not entries:
        raise ValueError("measure_batched_many needs at least one entry")
    for e in entries:
        check_decoding(e.gamma, e.threshold, case.temperature, min(case.max_new_tokens))
    device = str(next(target.parameters()).device)
    drafters = [e.make_drafter() if e.gamma > 0 else None for e in entries]
    speculative = [d is not None for d in drafters]
    memory: dict[int, list[float | None]] = {i: [] for i in range(-1, len(entries))}

    def side(key: int, d: BatchDrafter | None, g: int, t: float) -> Callable[[int], BatchRun]:
        def run(r: int) -> BatchRun:
            with peak_memory(device, memory[key]):
                return batch_generate(target, d, case, batch_size, g, t, seed + r, ctx)

        return run

    runs = {-1: side(-1, None, 0, 0.0)}
    for i, (e, d) in enumerate(zip(entries, drafters, strict=True)):
        if d is not None:
            runs[i] = side(i, d, e.gamma, e.threshold)
    build = GraphBuild()
    _warm_up(target, entries, drafters, case, batch_size, warmup, seed, ctx, build)
    ratios = RepeatRatios(speculative, _rate, on_repeat)

    def timing() -> dict[int, list[tuple[float, BatchRun]]]:
        ratios.clear()
        for m in memory.values():
            m.clear()
        for d in drafters:
            reset_sources(d)  # a hybrid counts its timed passes only (not the warm-up's)
        return interleaved(runs, repeats, device, ratios)

    compiled = ctx is not None and ctx.compiled
    timings = timed_without_compiles(timing, build) if compiled else timing()
    plain_rates = [_rate(x) for x in timings[-1]]
    plain = _side(timings[-1], plain_rates, memory[-1])
    plain_out = timings[-1][-1][1].outputs
    result = []
    for i in range(len(entries)):
        own = timings[i] if speculative[i] else timings[-1]
        rates = [_rate(x) for x in own]
        stats = SpecStats()
        if speculative[i]:
            for _, run in own:
                stats.add(run.stats)
        out = own[-1][1].outputs
        metrics = paired_metrics(
            rates, plain_rates, ratios.ratios[i], stats, speculative[i], repeats, source_stats(drafters[i])
        )
        m = BatchMeasurement(
            metrics, sum(map(len, out)), mismatches(plain_out, out, case.temperature), ratios.ratios[i],
            stats=stats, outputs=out, build=build, batch_size=batch_size,
            speculative=_side(own, rates, memory[i]) if speculative[i] else plain, plain=plain,
        )  # fmt: skip
        result.append(m)
    return result


def _rate(sec_run: tuple[float, BatchRun]) -> float:
    # Steady state: B requests in flight (the drain at the end of the queue is left out).
    return sec_run[1].steady_tokens_per_s


def _warm_up(
    target: PreTrainedModel,
    entries: list[BatchEntry],
    drafters: list[BatchDrafter | None],
    case: Case,
    batch_size: int,
    warmup: int,
    seed: int,
    ctx: ExecutionContext | None,
    build: GraphBuild,
) -> None:
    """Untimed: plain and each config on the first B prompts, then every graph the whole workload
    can reach (other draft widths near a request's end)."""
    warm = case.head(min(len(case.prompts), batch_size))
    with Untimed(build):
        for _ in range(warmup):
            batch_generate(target, None, warm, batch_size, 0, 0.0, seed, ctx)
            for e, d in zip(entries, drafters, strict=True):
                if d is not None:
                    batch_generate(target, d, warm, batch_size, e.gamma, e.threshold, seed, ctx)
        prebuild(ctx, target, [e.gamma for e, d in zip(entries, drafters, strict=True) if d is not None])


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


def fill_slots(case: Case, batch_size: int) -> Case:
    """`case` with its prompts cycled up to `batch_size` requests when it has fewer, so that every
    slot decodes: a budget that cut a trial to 2 prompts had made a "B = 4" pass two requests in a
    four-row batch, all four rows computed, two emitting, measured and predicted as B = 4."""
    n = len(case.prompts)
    if n >= batch_size:
        return case
    order = [i % n for i in range(batch_size)]
    return Case(
        [case.prompts[i] for i in order], [case.max_new_tokens[i] for i in order], case.eos, case.temperature
    )
