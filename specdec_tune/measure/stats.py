"""Statistics of paired, interleaved measurements: a seeded bootstrap interval of a speedup, the
head-to-head comparison of two configs (per-repeat ratio of their ratios to the same baseline
pass), a sign test, and the regression test `check` uses. Pure Python: no torch.

Every repeat of an interleaved run times the baseline and each config once, so config A's ratio
a_r and config B's ratio b_r share repeat r's baseline and a_r / b_r is A's speed over B's in that
repeat; the machine's drift cancels in it. Intervals are bootstrap percentile intervals, seeded so
the same numbers always give the same answer.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..checkpolicy import CHECK_POLICY
from ..measurepolicy import MEASURE_POLICY, MeasurePolicy


def bootstrap_interval(
    values: Sequence[float],
    stat: Callable[[Sequence[float]], float] = statistics.median,
    confidence: float = MEASURE_POLICY.confidence,
    resamples: int = MEASURE_POLICY.bootstrap_resamples,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat(values)`; one value gives a point interval.
    `confidence` and `resamples`: the search's (measurepolicy)."""
    if not values:
        return (math.nan, math.nan)
    if len(values) == 1:
        return (float(values[0]), float(values[0]))
    rng = random.Random(seed)
    n = len(values)
    draws = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    lo = draws[int(tail * (resamples - 1))]
    hi = draws[math.ceil((1 - tail) * (resamples - 1))]
    return (float(lo), float(hi))


def speedup_interval(
    speedups: Sequence[float], seed: int = 0, policy: MeasurePolicy = MEASURE_POLICY
) -> list[float] | None:
    """The interval of a measured speedup (the median of per-repeat ratios), rounded for a profile."""
    good = [s for s in speedups if s > 0 and math.isfinite(s)]
    if len(good) < 2:
        return None
    lo, hi = bootstrap_interval(
        good, confidence=policy.confidence, resamples=policy.bootstrap_resamples, seed=seed
    )
    return [round(lo, 4), round(hi, 4)]


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def sign_test_p(diffs: Sequence[float]) -> float:
    """Two-sided exact sign test of "positive and negative are equally likely" (zeros dropped)."""
    pos = sum(d > 0 for d in diffs)
    n = pos + sum(d < 0 for d in diffs)
    if n == 0:
        return 1.0
    k = min(pos, n - pos)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass
class Comparison:
    """A against B from paired repeats: the geometric mean of a_r / b_r and its interval, and the
    policy that says when it is resolved."""

    ratio: float
    interval: tuple[float, float]
    pairs: int
    sign_p: float
    policy: MeasurePolicy = field(default=MEASURE_POLICY, repr=False, compare=False)

    @property
    def resolved(self) -> bool:
        """One of the two is faster beyond the noise: on at least the policy's `min_pairs`, the
        interval excludes 1.0 and a sign test agrees at its `sign_alpha` (the bootstrap alone is
        too narrow on a handful of pairs)."""
        lo, hi = self.interval
        enough = self.pairs >= self.policy.min_pairs
        return enough and (lo > 1.0 or hi < 1.0) and self.sign_p <= self.policy.sign_alpha

    @property
    def a_wins(self) -> bool:
        return self.resolved and self.interval[0] > 1.0


def compare(
    a: Sequence[float], b: Sequence[float], seed: int = 0, policy: MeasurePolicy = MEASURE_POLICY
) -> Comparison:
    """Config A's per-repeat speedups against B's from the same interleaved repeats (paired)."""
    pairs = [x / y for x, y in zip(a, b, strict=True) if x > 0 and y > 0]
    if not pairs:
        return Comparison(math.nan, (math.nan, math.nan), 0, 1.0, policy)
    lo, hi = bootstrap_interval(
        pairs, geometric_mean, policy.confidence, policy.bootstrap_resamples, seed=seed
    )
    sign_p = sign_test_p([math.log(p) for p in pairs])
    return Comparison(geometric_mean(pairs), (lo, hi), len(pairs), sign_p, policy)


# ---------------------------------------------------------------------------------------- check

PASS, REGRESSION, INCONCLUSIVE = "pass", "regression", "inconclusive"


@dataclass
class Judgement:
    """`check`'s verdict on one speedup: the ratio now / stored, its interval, and the decision."""

    verdict: str  # PASS, REGRESSION or INCONCLUSIVE
    ratio: float  # median now / median stored
    interval: tuple[float, float]
    floor: float  # the ratio below which the speedup counts as regressed (1 - tolerance)
    confidence: float = CHECK_POLICY.confidence  # of `interval`

    @property
    def note(self) -> str:
        lo, hi = self.interval
        return f"now/stored {self.ratio:.3f} [{lo:.3f}, {hi:.3f}] ({self.confidence:.0%}; a regression is below {self.floor:.3f})"


def judge_speedup(
    now: Sequence[float],
    stored: Sequence[float],
    stored_median: float,
    tolerance: float,
    seed: int = 0,
    *,
    confidence: float = CHECK_POLICY.confidence,
    resamples: int = CHECK_POLICY.bootstrap_resamples,
) -> Judgement:
    """Is the speedup now (per-repeat ratios) below the stored one by more than `tolerance`?

    The interval of median(now) / median(stored) is bootstrapped over both samples (the stored
    per-repeat ratios, when the profile has them; otherwise the stored median alone). Interval
    wholly below the floor: regression; wholly above, or the estimate above it: pass. Across the
    floor with the estimate below it: a regression when the interval is narrower than the
    tolerance (the machine could resolve a change of that size), otherwise inconclusive.
    `confidence` and `resamples`: the interval's (checkpolicy).
    """
    floor = 1 - tolerance
    rng = random.Random(seed)
    base = list(stored) or [stored_median]
    # The stored repeats carry the spread; the stored median is the number (they agree unless the
    # profile was edited by hand, and then the edited number wins).
    scale = stored_median / statistics.median(base) if statistics.median(base) > 0 else 1.0
    base = [x * scale for x in base]
    now = list(now)
    ratio = statistics.median(now) / statistics.median(base)
    if len(now) < 2:
        return Judgement(PASS if ratio >= floor else INCONCLUSIVE, ratio, (ratio, ratio), floor, confidence)
    draws = sorted(
        statistics.median(rng.choices(now, k=len(now))) / statistics.median(rng.choices(base, k=len(base)))
        for _ in range(resamples)
    )
    tail = (1 - confidence) / 2
    lo, hi = draws[int(tail * (resamples - 1))], draws[math.ceil((1 - tail) * (resamples - 1))]
    if hi < floor:
        verdict = REGRESSION
    elif lo >= floor or ratio >= floor:
        verdict = PASS
    elif hi - lo <= tolerance:
        verdict = REGRESSION
    else:
        verdict = INCONCLUSIVE
    return Judgement(verdict, ratio, (lo, hi), floor, confidence)
