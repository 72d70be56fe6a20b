"""Racing the finalists: interleaved rounds are added until the leader is resolved against every
other finalist and the plain baseline, or the budget ends.

Each round measures the leader and the finalists not yet resolved against it, interleaved with the
baseline; a finalist's samples are its per-repeat speedups keyed by (round, repeat), so two
finalists are compared only on the repeats they shared (`stats.compare`, ratio of ratios). When
the budget ends with the leader unresolved, the round is a tie within noise: the leader is kept
(no config listed as best may measure below another of its round) and the configs it could not be
told from are named, simplest first (`simplicity`), for the reader who prefers fewer moving parts.
A leader that may be no faster than plain decoding (unresolved, its interval against it reaching
1.0) gives way to it. Pure logic: the measuring is the `measure_round` callback.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..domain import Config
from ..measure.stats import Comparison, compare

BASELINE = -1  # the plain target's index: its speedup is 1.0 in every repeat by definition
RESOLVED, TIE = "resolved", "tie within noise"

Samples = dict[tuple[int, int], float]


@dataclass
class RaceOutcome:
    samples: dict[int, Samples]  # per finalist index: (round, repeat) -> speedup
    chosen: int  # finalist index, or BASELINE
    verdict: str  # RESOLVED or TIE
    margin: Comparison | None  # the chosen one against the runner-up, paired
    runner_up: int | None
    rounds: int
    # indices the chosen one could not be told from, simplest first
    tied: list[int] = field(default_factory=list)


def simplicity(config: Config) -> tuple:
    """Fewer moving parts sort first: plain decoding, no threshold over a threshold, a fixed gamma
    over a policy, a smaller gamma, no draft model over a draft model."""
    uses_model = config.draft.kind in ("model", "hybrid", "layer_skip")
    return (config.gamma > 0, config.threshold > 0, config.gamma_policy != "fixed", config.gamma, uses_model)


def median_of(samples: Samples) -> float:
    return statistics.median(samples.values()) if samples else 0.0


def paired(a: Samples, b: Samples, seed: int = 0) -> Comparison:
    """A against B on the repeats both were measured in."""
    shared = sorted(a.keys() & b.keys())
    return compare([a[k] for k in shared], [b[k] for k in shared], seed=seed)


def standings(samples: dict[int, Samples], seed: int = 0) -> tuple[int, list[int]]:
    """The leader (highest median speedup; the baseline counts at 1.0) and the entrants it is not
    yet resolved faster than."""
    every = {**samples, BASELINE: _baseline_like(samples)}
    leader = max(every, key=lambda i: (median_of(every[i]), i != BASELINE))
    open_ = [i for i in every if i != leader and not paired(every[leader], every[i], seed).a_wins]
    return leader, open_


def race(
    configs: list[Config],
    measure_round: Callable[[list[int], int, int], list[list[float]]],
    first_repeats: int,
    step_repeats: int,
    max_repeats: int,
    budget_s: float | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> RaceOutcome:
    """Race `configs` (distinct finalists). `measure_round(indices, repeats, round)` measures those
    finalists interleaved with the baseline and returns each one's per-repeat speedups.

    Rounds stop when the leader is resolved, when another round would take an entrant past
    `max_repeats` repeats (a hard cap: the first round too is cut to it), or when another round
    would not fit `budget_s` (its length estimated from the last round's).
    """
    started = clock()
    samples: dict[int, Samples] = {i: {} for i in range(len(configs))}
    todo, repeats, rnd = list(range(len(configs))), min(first_repeats, max_repeats), 0
    last_s, last_n = 0.0, 1
    while True:
        t0 = clock()
        for i, speedups in zip(todo, measure_round(todo, repeats, rnd), strict=True):
            samples[i].update({(rnd, r): s for r, s in enumerate(speedups)})
        last_s, last_n = clock() - t0, len(todo) * repeats
        rnd += 1
        leader, open_ = standings(samples, seed)
        if not open_:
            break
        todo = sorted({leader, *open_} - {BASELINE})
        repeats = step_repeats
        # the most repeats any entrant of the next round has: a leader that sat out rounds (resolved
        # below, then back in front) has fewer than the others it races
        done = max(len(samples[i]) for i in todo)
        if done + repeats > max_repeats:
            break
        next_s = last_s * len(todo) * repeats / max(last_n, 1)
        if budget_s is not None and clock() - started + next_s > budget_s:
            break
    return _outcome(configs, samples, rnd, seed)


def _outcome(configs: list[Config], samples: dict[int, Samples], rounds: int, seed: int) -> RaceOutcome:
    """The leader stays the choice even when unresolved: a config listed as best must not measure
    below another in the same round. The tied ones are kept, simplest first, for the reader to see
    (the profile's `search.final_tied`). The exception is plain decoding: a leader that may be no
    faster than it (unresolved, and its paired interval against it reaching 1.0) is not worth
    speculating for, so plain decoding is chosen. A leader whose whole interval lies above plain
    decoding stays, though the sign test did not agree: under bursts one repeat of six hit by a
    burst (5 of 6 above 1.0, p = 0.22) left a leader at 1.83x [1.08, 2.19] unresolved, and plain
    decoding chosen in its place was a best listed below every alternative of its round. Plain
    decoding is then not named among the tied (its interval says it is slower); the verdict stays
    a tie, since the sign test did not agree."""
    leader, open_ = standings(samples, seed)
    every = {**samples, BASELINE: _baseline_like(samples)}
    tied = sorted(open_, key=lambda i: (_simplicity_of(configs, i), -median_of(every[i])))
    chosen = BASELINE if BASELINE in open_ and _may_be_plain(every[leader], every[BASELINE], seed) else leader
    if chosen == BASELINE and leader != BASELINE:
        tied = [leader] + [i for i in tied if i != BASELINE]
    elif chosen != BASELINE:
        tied = [i for i in tied if i != BASELINE]
    verdict = TIE if open_ else RESOLVED
    others = [i for i in every if i != chosen]
    runner_up = max(others, key=lambda i: median_of(every[i])) if others else None
    margin = paired(every[chosen], every[runner_up], seed) if runner_up is not None else None
    return RaceOutcome(samples, chosen, verdict, margin, runner_up, rounds, tied)


def _may_be_plain(leader: Samples, plain: Samples, seed: int) -> bool:
    """Could the leader be no faster than plain decoding: its paired interval reaches 1.0?"""
    lo, _ = paired(leader, plain, seed).interval
    return not lo > 1.0  # a NaN interval (nothing paired) counts as may-be


def _simplicity_of(configs: list[Config], i: int) -> tuple:
    return (False,) if i == BASELINE else simplicity(configs[i])


def _baseline_like(samples: dict[int, Samples]) -> Samples:
    """The baseline's samples: 1.0 on every repeat any finalist was measured in."""
    return {k: 1.0 for s in samples.values() for k in s}
