"""The final round's statistics on synthetic paired ratios: intervals, the paired comparison,
racing until resolved or tied, the simplest config on a tie, outliers, and check's test."""

from __future__ import annotations

import random

import pytest

from specdec_tune.domain import NO_DRAFT, Config, DraftSpec, Metrics, Result
from specdec_tune.measure import stats
from specdec_tune.measurepolicy import MEASURE_POLICY
from specdec_tune.search.final import is_outlier, pick_finalists, pool
from specdec_tune.search.racing import BASELINE, RESOLVED, TIE, median_of, race, simplicity

MODEL = DraftSpec("draft-1l", "model", path="x")
LOOKUP = DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3)


def noisy(true: list[float], noise: float, seed: int = 0):
    """A measure_round callback: per-repeat ratios around each config's true speedup."""
    rng = random.Random(seed)
    calls = []

    def measure_round(indices, repeats, rnd):
        calls.append((list(indices), repeats, rnd))
        return [[true[i] * (1 + rng.gauss(0, noise)) for _ in range(repeats)] for i in indices]

    measure_round.calls = calls
    return measure_round


def test_bootstrap_interval_is_seeded_and_contains_the_median():
    values = [1.5, 1.62, 1.55, 1.7, 1.58, 1.6]
    lo, hi = stats.bootstrap_interval(values, seed=3)
    assert lo <= 1.59 <= hi and (lo, hi) == stats.bootstrap_interval(values, seed=3)
    assert stats.speedup_interval([1.5]) is None and stats.speedup_interval([]) is None


def test_sign_test():
    assert stats.sign_test_p([1] * 6) == pytest.approx(2 / 64)
    assert stats.sign_test_p([1, -1, 1, -1]) == 1.0 and stats.sign_test_p([0, 0]) == 1.0


def test_compare_pairs_repeats_so_shared_drift_cancels():
    # Both configs swing 30 % with the machine from repeat to repeat, A is always 5 % faster.
    drift = [1.0, 0.7, 1.3, 0.8, 1.2, 0.9]
    a = [1.05 * 1.6 * d for d in drift]
    b = [1.6 * d for d in drift]
    c = stats.compare(a, b)
    assert c.ratio == pytest.approx(1.05) and c.resolved and c.a_wins
    assert not stats.compare(a[:4], b[:4]).resolved  # too few pairs to decide anything


def test_race_adds_rounds_until_the_leader_is_resolved():
    configs = [Config(MODEL, 5), Config(LOOKUP, 3)]
    measure_round = noisy([1.6, 1.45], 0.03, seed=1)
    out = race(configs, measure_round, first_repeats=4, step_repeats=2, max_repeats=16)
    assert out.verdict == RESOLVED and out.chosen == 0 and out.runner_up == 1
    assert out.margin.interval[0] > 1.0
    assert measure_round.calls[0] == ([0, 1], 4, 0) and len(measure_round.calls) >= 2
    assert all(call[1] == 2 for call in measure_round.calls[1:])


def test_a_tie_keeps_the_fastest_and_names_the_tied_simplest_first():
    # Equal configs: the budget of repeats ends unresolved. The one measured fastest stays best
    # (a best must not measure below another config of its round); the other is named as tied.
    configs = [Config(MODEL, 5, 0.3), Config(MODEL, 3, 0.0), Config(MODEL, 4, 0.0)]
    out = race(configs, noisy([1.6, 1.6, 1.6], 0.15, seed=2), 4, 2, max_repeats=8)
    medians = {i: median_of(out.samples[i]) for i in range(3)}
    assert out.verdict == TIE and out.chosen == max(medians, key=medians.get)
    assert out.chosen not in out.tied and len(out.tied) >= 1
    assert out.tied == sorted(out.tied, key=lambda i: simplicity(configs[i]))  # simplest first
    assert max(len(s) for s in out.samples.values()) <= 8


def test_race_stops_at_the_time_budget():
    ticks = iter(range(0, 1000, 10))  # every clock reading is 10 s later
    configs = [Config(MODEL, 5), Config(MODEL, 4)]
    measure_round = noisy([1.6, 1.6], 0.1)
    out = race(configs, measure_round, 4, 2, 64, budget_s=25, clock=lambda: next(ticks))
    assert out.verdict == TIE and len(measure_round.calls) == 1


def test_a_leader_not_resolved_against_plain_decoding_ties_with_it():
    out = race([Config(MODEL, 4)], noisy([1.01], 0.2, seed=4), 4, 2, 8)
    assert out.verdict == TIE and out.chosen == BASELINE


def test_simplicity_orders_fewer_moving_parts_first():
    configs = [
        Config(MODEL, 3, 0.2),
        Config(MODEL, 5),
        Config(MODEL, 3),
        Config(LOOKUP, 3),
        Config(NO_DRAFT, 0),
    ]
    ranked = sorted(configs, key=simplicity)
    assert [c.label for c in ranked] == [
        "no speculation",
        "prompt-lookup γ=3",
        "draft-1l γ=3 t=0.00",
        "draft-1l γ=5 t=0.00",
        "draft-1l γ=3 t=0.20",
    ]


def _result(spec: DraftSpec, gamma: int, speedup: float, spread: float = 0.1) -> Result:
    return Result(Config(spec, gamma), Metrics(100 * speedup, 100, speedup, spread, 0.5, 2.0))


def test_an_outlier_trial_sets_no_bar_and_is_only_re_measured_with_a_slot_to_spare():
    draft2 = DraftSpec("draft-2l", "model", path="y")
    results = [
        _result(draft2, 5, 5.32),  # above what the cost model allows at any acceptance
        _result(MODEL, 5, 2.46),
        _result(LOOKUP, 4, 2.0),
        _result(MODEL, 3, 1.9, spread=0.9),  # repeats disagree wildly
    ]
    ceiling = {"draft-2l": 2.9, "draft-1l": 3.0, "prompt-lookup": 6.0}

    def ceil(c):
        return ceiling[c.draft.name]

    assert [is_outlier(r, ceil) for r in results] == [True, False, False, True]
    two = pick_finalists(results, 2, 0.75, ceil)
    assert [r.metrics.speedup for r in two] == [2.46, 2.0]  # the 5.32× trial crowds nobody out
    three = pick_finalists(results, 3, 0.75, ceil)
    assert 5.32 in [r.metrics.speedup for r in three]  # re-measured in the spare slot, not promoted
    # Without the ceiling, the lucky trial's bar (0.75 × 5.32) would have cut prompt lookup.
    assert 2.0 not in [r.metrics.speedup for r in pick_finalists(results, 3, 0.75, None)]


def test_pooled_metrics_take_every_repeat():
    parts = [
        Metrics(150, 100, 1.5, 0.1, 0.5, 2.0, repeats=4),
        Metrics(170, 100, 1.7, 0.1, 0.7, 2.4, repeats=2),
    ]
    samples = [1.4, 1.5, 1.5, 1.6, 1.7, 1.7]
    m = pool(parts, samples, seed=0)
    assert m.repeats == 6 and m.speedup == pytest.approx(1.55) and m.speedup_samples == samples
    assert m.tokens_per_s == pytest.approx((150 * 4 + 170 * 2) / 6)
    assert m.acceptance_rate == pytest.approx((0.5 * 4 + 0.7 * 2) / 6)
    assert m.speedup_interval[0] <= 1.55 <= m.speedup_interval[1]


def test_judge_speedup_regression_pass_and_inconclusive():
    stored = [2.0, 2.02, 2.05, 1.98]
    assert stats.judge_speedup([2.01, 1.97, 2.03], stored, 2.02, 0.10).verdict == stats.PASS
    assert stats.judge_speedup([1.62, 1.7, 1.65, 1.68], stored, 2.02, 0.10).verdict == stats.REGRESSION
    # A 15 % slowdown measured on a quiet machine: tight interval, estimate below the floor.
    assert stats.judge_speedup([1.70, 1.72, 1.73, 1.71, 1.74], stored, 2.02, 0.10).verdict == stats.REGRESSION
    # Too noisy to tell a 10 % drop from none: neither pass nor regression.
    wild = stats.judge_speedup([1.3, 2.1, 1.6, 2.3, 1.5], stored, 2.02, 0.10)
    assert wild.verdict == stats.INCONCLUSIVE and wild.interval[1] - wild.interval[0] > 0.1
    # An old profile without samples: judged against its median alone.
    assert stats.judge_speedup([2.0, 2.05, 1.99], [], 2.02, 0.10).verdict == stats.PASS


def test_a_leader_wholly_above_plain_decoding_stays_though_the_sign_test_disagrees():
    # A loaded run's final round (bursts): one repeat of six hit by a burst. The sign test (5 of 6,
    # p = 0.22) cannot resolve the leader against plain decoding, but its interval lies above 1.0:
    # the leader stays best (plain decoding at 1.0 would be a best below every alternative).
    rounds = {
        0: [2.0, 1.6563, 2.0472, 1.2896, 0.86078, 2.3376],
        1: [1.9698, 1.7839, 1.9516, 1.2888, 0.95845, 1.5315],
    }

    def measure_round(indices, repeats, rnd):
        return [rounds[i] for i in indices]

    out = race([Config(MODEL, 6), Config(MODEL, 7)], measure_round, 6, 3, max_repeats=6)
    assert out.verdict == TIE and out.chosen == 0 and out.tied == [1]  # plain decoding is not "as fast"
    assert stats.sign_test_p([x - 1 for x in rounds[0]]) > MEASURE_POLICY.sign_alpha
    # The same leader pulled to 1.0 by the noise (interval reaching 1.0) still gives way.
    rounds[0] = [1.08, 0.93, 1.1, 0.97, 1.05, 1.02]
    rounds[1] = [1.0, 0.95, 1.01, 0.96, 1.0, 0.98]
    out = race([Config(MODEL, 6), Config(MODEL, 7)], measure_round, 6, 3, max_repeats=6)
    assert out.verdict == TIE and out.chosen == BASELINE


def test_no_finalist_passes_max_repeats_when_a_config_left_behind_takes_the_lead():
    """A config resolved below the leader after the first round sits out the next rounds; when the
    others' medians then fall below its own it leads again, with fewer repeats than they have. The
    cap counts the most repeats any entrant of the next round already has, not the leader's: it
    counted the leader's, and the other two went on to 18 repeats of 12."""
    first = {0: [1.5] * 6, 1: [1.51, 1.49] * 3, 2: [1.3] * 6}

    def measure_round(indices, repeats, rnd):
        return [first[i] if rnd == 0 else [1.0] * repeats for i in indices]

    configs = [Config(MODEL, 5), Config(MODEL, 4), Config(LOOKUP, 3)]
    out = race(configs, measure_round, first_repeats=6, step_repeats=2, max_repeats=12)
    assert max(len(s) for s in out.samples.values()) <= 12, {i: len(s) for i, s in out.samples.items()}
