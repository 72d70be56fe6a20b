"""Run one config over a workload against the plain target, timed in the same run.

Baseline and speculative passes alternate (ABBA) after a warm-up, so drift of the machine hits
both; the speedup is the median of per-repeat throughput ratios, with the spread reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .drafters import Drafter
from .engine import SpecStats, autoregressive_generate, speculative_generate, validate_args
from .errors import SpecDecError
from .profile import Metrics
from .timing import median, spread, timed


@dataclass
class Case:
    """Encoded prompts with their token budgets: what one pass generates."""

    prompts: list[list[int]]
    max_new_tokens: list[int]
    eos: list[int] = field(default_factory=list)
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if not self.prompts:
            raise SpecDecError("the workload has no prompts")
        if len(self.max_new_tokens) != len(self.prompts):
            raise ValueError("one max_new_tokens per prompt")


@dataclass
class Measurement:
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    speedup_spread: float
    acceptance_rate: float
    mean_accepted_len: float
    per_position_acceptance: list[float]
    repeats: int
    tokens: int  # tokens generated per pass
    mismatches: int  # greedy only: prompts whose output differs from the baseline's (0 = exact)
    speedups: list[float] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    outputs: list[list[int]] = field(default_factory=list)

    def to_metrics(self, predicted_speedup: float | None = None) -> Metrics:
        return Metrics(
            tokens_per_s=self.tokens_per_s,
            baseline_tokens_per_s=self.baseline_tokens_per_s,
            speedup=self.speedup,
            speedup_spread=self.speedup_spread,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_len=self.mean_accepted_len,
            per_position_acceptance=list(self.per_position_acceptance),
            repeats=self.repeats,
            predicted_speedup=predicted_speedup,
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("stats")
        d.pop("outputs")
        return d


def run_pass(
    target: Any,
    drafter: Drafter | None,
    gamma: int,
    threshold: float,
    case: Case,
    seed: int = 0,
) -> tuple[list[list[int]], SpecStats]:
    """Generate every prompt of `case` once; gamma 0 or no drafter is the plain target."""
    device = next(target.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed) if case.temperature > 0 else None
    outputs, stats = [], SpecStats()
    for prompt, max_new in zip(case.prompts, case.max_new_tokens, strict=True):
        if drafter is None or gamma == 0:
            gen = autoregressive_generate(target, prompt, max_new, case.temperature, case.eos, generator)
        else:
            gen = speculative_generate(
                target, drafter, prompt, gamma, threshold, case.temperature, max_new, case.eos, generator
            )
        outputs.append(gen.tokens)
        stats.add(gen.stats)
    return outputs, stats


@dataclass
class Entry:
    """One config to time: a drafter (None = plain target), gamma and confidence threshold."""

    drafter: Drafter | None
    gamma: int
    threshold: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.drafter is not None and self.gamma > 0


def measure(
    target: Any,
    drafter: Drafter | None,
    gamma: int,
    threshold: float,
    case: Case,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    on_repeat: Callable[[int, float], None] | None = None,
) -> Measurement:
    """Time `case` with the config and with the plain target, interleaved, `repeats` times each.

    `on_repeat(i, speedup_so_far)` is called after each repeat (a tuner may stop early there).
    """
    hook = None if on_repeat is None else (lambda r, speedups: on_repeat(r, speedups[0]))
    return measure_many(target, [Entry(drafter, gamma, threshold)], case, repeats, warmup, seed, hook)[0]


def measure_many(
    target: Any,
    entries: list[Entry],
    case: Case,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    on_repeat: Callable[[int, list[float]], None] | None = None,
) -> list[Measurement]:
    """Time several configs and the plain target in one interleaved run: one Measurement each.

    Every repeat runs the baseline and each config once; the order reverses on odd repeats
    (ABBA, generalised), so a slow drift of the machine favours none of them. A config's speedup
    is the median over repeats of its rate divided by the baseline rate of the same repeat.
    `on_repeat(i, medians_so_far)` is called after each repeat (a tuner may stop early there).
    """
    if not entries:
        raise ValueError("measure_many needs at least one entry")
    for e in entries:
        validate_args(e.gamma, e.threshold, case.temperature, min(case.max_new_tokens))
    if repeats < 1:
        raise SpecDecError(f"repeats must be >= 1, got {repeats}")
    device = str(next(target.parameters()).device)
    warm = Case(case.prompts[:1], case.max_new_tokens[:1], case.eos, case.temperature)
    for _ in range(warmup):
        run_pass(target, None, 0, 0.0, warm, seed)
        for e in entries:
            if e.speculative:
                run_pass(target, e.drafter, e.gamma, e.threshold, warm, seed)

    n = len(entries)
    base_rates: list[float] = []
    rates: list[list[float]] = [[] for _ in entries]
    ratios: list[list[float]] = [[] for _ in entries]
    stats = [SpecStats() for _ in entries]
    outs: list[list[list[int]]] = [[] for _ in entries]
    base_out: list[list[int]] = []
    # -1 is the baseline; plain-target entries reuse the baseline pass instead of timing it twice.
    order = [-1, *(i for i, e in enumerate(entries) if e.speculative)]
    for r in range(repeats):
        for i in order if r % 2 == 0 else order[::-1]:
            e = entries[i] if i >= 0 else Entry(None, 0)
            sec, (out, s) = timed(
                lambda e=e, r=r: run_pass(target, e.drafter, e.gamma, e.threshold, case, seed + r), device
            )
            rate = sum(map(len, out)) / sec
            if i < 0:
                base_rates.append(rate)
                base_out = out
            else:
                rates[i].append(rate)
                stats[i].add(s)
                outs[i] = out
        for i in range(n):
            if not entries[i].speculative:
                rates[i].append(base_rates[-1])
                outs[i] = base_out
            ratios[i].append(rates[i][-1] / base_rates[-1])
        if on_repeat is not None:
            on_repeat(r, [median(x) for x in ratios])

    result = []
    for i, e in enumerate(entries):
        mismatches = 0
        if case.temperature == 0.0:
            mismatches = sum(a != b for a, b in zip(base_out, outs[i], strict=True))
        result.append(
            Measurement(
                tokens_per_s=median(rates[i]),
                baseline_tokens_per_s=median(base_rates),
                speedup=median(ratios[i]),
                speedup_spread=spread(ratios[i]),
                acceptance_rate=stats[i].acceptance_rate,
                mean_accepted_len=stats[i].mean_accepted_len if e.speculative else 1.0,
                per_position_acceptance=stats[i].per_position_acceptance,
                repeats=repeats,
                tokens=sum(map(len, outs[i])),
                mismatches=mismatches,
                speedups=ratios[i],
                stats=stats[i],
                outputs=outs[i],
            )
        )
    return result
