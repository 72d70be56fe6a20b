"""Run configs over a workload against the plain target, timed in the same run.

Baseline and speculative passes alternate prompt by prompt (`timing.interleaved_parts`) after a
warm-up, so drift of the machine and another job's bursts hit all of them alike; a config's speedup is the median of its per-repeat throughput
ratios to the same repeat's baseline, with the spread reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..limits import check_count, check_decoding
from ..measurement import Measurement
from ..measurepolicy import MEASURE_POLICY
from ..runtime.caches.modes import ExecutionContext
from ..runtime.decode import SpecStats, autoregressive_generate, speculative_generate
from ..runtime.drafting.drafters import Drafter
from ..runtime.drafting.hybrid import SourceCounts, counts_setter, reset_sources, source_stats
from ..runtime.graphs import GraphBuild, Untimed, prebuild, timed_without_compiles
from ..runtime.workloads import Case
from .decode_anchor import DecodeAnchor, steps_for
from .paired import RepeatRatios, mismatches, paired_metrics
from .planted import sleep_for, slower_spec_factor
from .preemption import PartLog, accounted, clean_ratios
from .timing import interleaved_parts

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Entry:
    """One config to time: a drafter (None = plain target), gamma and confidence threshold."""

    drafter: Drafter | None
    gamma: int
    threshold: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.drafter is not None and self.gamma > 0


def run_pass(
    target: PreTrainedModel,
    drafter: Drafter | None,
    gamma: int,
    threshold: float,
    case: Case,
    seed: int = 0,
    ctx: ExecutionContext | None = None,
) -> tuple[list[list[int]], SpecStats]:
    """Generate every prompt of `case` once; gamma 0 or no drafter is the plain target (its cache
    under `ctx`, default eager)."""
    generator = _generator(target, case, seed)
    outputs, stats = [], SpecStats()
    for i in range(len(case.prompts)):
        tokens, s = run_prompt(target, drafter, gamma, threshold, case, i, generator, ctx)
        outputs.append(tokens)
        stats.add(s)
    return outputs, stats


def run_prompt(
    target: PreTrainedModel,
    drafter: Drafter | None,
    gamma: int,
    threshold: float,
    case: Case,
    i: int,
    generator: torch.Generator | None = None,
    ctx: ExecutionContext | None = None,
) -> tuple[list[int], SpecStats]:
    """Generate prompt `i` of `case` once (sampling from `generator` when the case samples)."""
    prompt, max_new = case.prompts[i], case.max_new_tokens[i]
    if drafter is None or gamma == 0:
        gen = autoregressive_generate(target, prompt, max_new, case.temperature, case.eos, generator, ctx)
        return gen.tokens, gen.stats
    started = time.perf_counter()
    gen = speculative_generate(
        target, drafter, prompt, gamma, threshold, case.temperature, max_new, case.eos, generator, ctx
    )
    sleep_for(time.perf_counter() - started, slower_spec_factor())  # a test-only hook (measure.planted)
    return gen.tokens, gen.stats


def _generator(target: PreTrainedModel, case: Case, seed: int) -> torch.Generator | None:
    if case.temperature <= 0:
        return None
    return torch.Generator(device=next(target.parameters()).device).manual_seed(seed)


def measure(
    target: PreTrainedModel,
    drafter: Drafter | None,
    gamma: int,
    threshold: float,
    case: Case,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    on_repeat: Callable[[int, float], None] | None = None,
    ctx: ExecutionContext | None = None,
    anchor: DecodeAnchor | None = None,
) -> Measurement:
    """Time `case` with the config and with the plain target, interleaved, `repeats` times each.

    `on_repeat(i, speedup_so_far)` is called after each repeat (a tuner may stop early there).
    `anchor`: a decode anchor timed between them too (`Measurement.plain_per_anchor`).
    """
    hook = None if on_repeat is None else (lambda r, speedups: on_repeat(r, speedups[0]))
    entries = [Entry(drafter, gamma, threshold)]
    return measure_many(target, entries, case, repeats, warmup, seed, hook, ctx, anchor)[0]


def measure_many(
    target: PreTrainedModel,
    entries: list[Entry],
    case: Case,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    on_repeat: Callable[[int, list[float]], None] | None = None,
    ctx: ExecutionContext | None = None,
    anchor: DecodeAnchor | None = None,
) -> list[Measurement]:
    """Time several configs and the plain target in one interleaved run: one Measurement each.

    Every repeat runs the baseline and each config once (plain-target entries share the baseline
    pass). A config's speedup is the median over repeats of its rate divided by the baseline
    rate of the same repeat. `on_repeat(i, medians_so_far)` is called after each repeat. With
    `anchor` (measure.decode_anchor), its steps take their turn too, prompt by prompt, and each
    Measurement carries the plain tokens/s per anchor step/s of every repeat.
    """
    if not entries:
        raise ValueError("measure_many needs at least one entry")
    for e in entries:
        check_decoding(e.gamma, e.threshold, case.temperature, min(case.max_new_tokens))
    check_count(repeats, "repeats")
    device = str(next(target.parameters()).device)
    for e in entries:
        reset_sources(e.drafter)
    build = GraphBuild()
    _warm_up(target, entries, case, warmup, seed, ctx, anchor, build)
    parts = _Parts(target, entries, case, seed, ctx)
    runs = parts.runs()
    if anchor is not None:  # key -2: the decode anchor, a part's steps (its result) per prompt
        steps = steps_for(case.max_new_tokens)
        runs[-2] = lambda r, p: anchor.run(steps[p])
    ratios = RepeatRatios([e.speculative for e in entries], _rate, on_repeat)
    log: dict[int, list[list[tuple[float, float]]]] = {}  # per part: seconds, waited for a CPU

    def timing() -> dict[int, list[tuple[float, list[Any]]]]:
        ratios.clear()
        parts.clear()
        log.clear()
        return interleaved_parts(runs, repeats, len(case.prompts), device, ratios, log)

    compiled = ctx is not None and ctx.compiled
    timings = timed_without_compiles(timing, build) if compiled else timing()
    base_rates = [_rate(t) for t in timings[-1]]
    anchor_rates = [sum(parts) / sec for sec, parts in timings.get(-2, [])]
    per_anchor = [b / a for b, a in zip(base_rates, anchor_rates, strict=False)]
    base_out = [tokens for tokens, _ in timings[-1][-1][1]]
    result = []
    for i, e in enumerate(entries):
        own = timings[i] if e.speculative else timings[-1]
        stats = SpecStats()
        per_source = {}
        if e.speculative:
            for _, passed in own:
                for _, s in passed:
                    stats.add(s)
            per_source = parts.per_source(i)
        outs = [tokens for tokens, _ in own[-1][1]]
        own_rates = [_rate(t) for t in own]
        metrics = paired_metrics(
            own_rates, base_rates, ratios.ratios[i], stats, e.speculative, repeats, per_source
        )
        m = Measurement(
            metrics, sum(map(len, outs)), mismatches(base_out, outs, case.temperature), ratios.ratios[i],
            own_rates, base_rates, stats=stats, outputs=outs, build=build, anchor_rates=list(anchor_rates),
            plain_per_anchor=list(per_anchor), **preempted(log, timings, i if e.speculative else -1),
        )  # fmt: skip
        result.append(m)
    return result


def _rate(sec_parts: tuple[float, list[Any]]) -> float:
    """Tokens per second of one timed pass (its prompts' parts)."""
    sec, parts = sec_parts
    return sum(len(tokens) for tokens, _ in parts) / sec


def _warm_up(
    target: PreTrainedModel,
    entries: list[Entry],
    case: Case,
    warmup: int,
    seed: int,
    ctx: ExecutionContext | None,
    anchor: DecodeAnchor | None,
    build: GraphBuild,
) -> None:
    """Untimed: the baseline and each config on the first prompt, then every graph another prompt
    can reach (other draft widths near a request's end), and the anchor once."""
    warm = case.head(1)
    with Untimed(build):
        for _ in range(warmup):
            run_pass(target, None, 0, 0.0, warm, seed, ctx)
            for e in entries:
                if e.speculative:
                    run_pass(target, e.drafter, e.gamma, e.threshold, warm, seed, ctx)
        prebuild(ctx, target, [e.gamma for e in entries if e.speculative])
        if anchor is not None:
            anchor.run(1)


class _Parts:
    """The timed parts of one interleaved run, a prompt each: key -1 is the baseline, the entries
    follow by index (timing.interleaved_parts); a pass's generator lives from its first prompt to
    its last. A hybrid's per-source counts are kept per entry: entries may share one drafter object
    (gamma 7 and 8 of one hybrid), and the warm-up is not theirs."""

    def __init__(
        self,
        target: PreTrainedModel,
        entries: list[Entry],
        case: Case,
        seed: int,
        ctx: ExecutionContext | None,
    ) -> None:
        self.target, self.entries, self.case, self.seed, self.ctx = target, entries, case, seed, ctx
        self.generators: dict[tuple[int, int], torch.Generator | None] = {}
        setters = {i: counts_setter(e.drafter) for i, e in enumerate(entries) if e.speculative}
        self.setters = {i: into for i, into in setters.items() if into is not None}
        self.counts: dict[int, SourceCounts] = {}

    def clear(self) -> None:
        """Before a timed round: new generators, and new counts (made here, not per timed prompt)."""
        self.generators.clear()
        self.counts.clear()
        self.counts.update({i: SourceCounts() for i in self.setters})

    def runs(self) -> dict[int, Callable[[int, int], Any]]:
        runs: dict[int, Callable[[int, int], Any]] = {-1: self._part(-1, None)}
        for i, e in enumerate(self.entries):
            if e.speculative:
                runs[i] = self._part(i, e)
        return runs

    def _part(self, k: int, e: Entry | None) -> Callable[[int, int], Any]:
        into = self.setters.get(k)
        target, case, ctx, generators = self.target, self.case, self.ctx, self.generators

        def run(r: int, p: int) -> tuple[list[int], SpecStats]:
            if p == 0:
                generators[(k, r)] = _generator(target, case, self.seed + r)
            if e is None:
                return run_prompt(target, None, 0, 0.0, case, p, generators[(k, r)], ctx)
            if into is not None:
                into(self.counts[k])
            return run_prompt(target, e.drafter, e.gamma, e.threshold, case, p, generators[(k, r)], ctx)

        return run

    def per_source(self, i: int) -> dict[str, dict[str, float]]:
        """Entry i's per-source counters over its timed passes ({} for a single-source drafter)."""
        if i not in self.setters:
            return {}
        self.setters[i](self.counts[i])
        return source_stats(self.entries[i].drafter)


def preempted(
    log: dict[int, list[list[tuple[float, float]]]],
    timings: dict[int, list[tuple[float, list[Any]]]],
    key: int,
) -> dict[str, Any]:
    """Measurement's preemption fields for entry `key` (-1: plain) from interleaved_parts' `log`
    (preemption.accounted, at the policy's `clean_wait_share`), and the plain rate per anchor step
    of repeats rebuilt from unpreempted prompts."""
    if not log:
        return {}

    def parts(k: int, units: Callable[[Any], float]) -> PartLog:
        return [
            [(sec, waited, units(res)) for (sec, waited), res in zip(rep_log, rep[1], strict=False)]
            for rep_log, rep in zip(log.get(k, []), timings.get(k, []), strict=False)
        ]

    share = MEASURE_POLICY.clean_wait_share
    plain = parts(-1, lambda r: len(r[0]))
    out = accounted(parts(key, lambda r: len(r[0])), plain, share)
    if out and key == -1:  # plain decoding against itself: 1.0 a repeat, whatever the load
        out |= {"clean_speedups": [1.0] * len(plain), "clean_share": 1.0}
    if out and -2 in log:
        out["clean_plain_per_anchor"] = clean_ratios(plain, parts(-2, float), share)[0]
    return out
