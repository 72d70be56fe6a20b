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
    validate_args(gamma, threshold, case.temperature, min(case.max_new_tokens))
    if repeats < 1:
        raise SpecDecError(f"repeats must be >= 1, got {repeats}")
    device = str(next(target.parameters()).device)
    speculative = drafter is not None and gamma > 0
    warm = Case(case.prompts[:1], case.max_new_tokens[:1], case.eos, case.temperature)
    for _ in range(warmup):
        run_pass(target, None, 0, 0.0, warm, seed)
        if speculative:
            run_pass(target, drafter, gamma, threshold, warm, seed)

    base_rates, spec_rates, speedups = [], [], []
    stats = SpecStats()
    base_out: list[list[int]] = []
    spec_out: list[list[int]] = []
    for r in range(repeats):
        # ABBA order: a slow drift of the machine favours neither side.
        order = ("base", "spec") if r % 2 == 0 else ("spec", "base")
        for which in order:
            if which == "base":
                sec, (base_out, _) = timed(lambda r=r: run_pass(target, None, 0, 0.0, case, seed + r), device)
                base_rates.append(sum(map(len, base_out)) / sec)
            elif speculative:
                sec, (spec_out, s) = timed(
                    lambda r=r: run_pass(target, drafter, gamma, threshold, case, seed + r), device
                )
                spec_rates.append(sum(map(len, spec_out)) / sec)
                stats.add(s)
        if not speculative:
            spec_rates.append(base_rates[-1])
            spec_out = base_out
        speedups.append(spec_rates[-1] / base_rates[-1])
        if on_repeat is not None:
            on_repeat(r, median(speedups))

    mismatches = 0
    if case.temperature == 0.0:
        mismatches = sum(a != b for a, b in zip(base_out, spec_out, strict=True))
    return Measurement(
        tokens_per_s=median(spec_rates),
        baseline_tokens_per_s=median(base_rates),
        speedup=median(speedups),
        speedup_spread=spread(speedups),
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_len=stats.mean_accepted_len if speculative else 1.0,
        per_position_acceptance=stats.per_position_acceptance,
        repeats=repeats,
        tokens=sum(map(len, spec_out)),
        mismatches=mismatches,
        speedups=speedups,
        stats=stats,
        outputs=spec_out,
    )
