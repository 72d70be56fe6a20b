"""The cost model's closed forms against a seeded simulation of the acceptance process."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_tune.domain import Costs, DraftCosts
from specdec_tune.errors import SpecDecError
from specdec_tune.search.costmodel import (
    CostModel,
    acceptance_vector_from_counts,
    acceptance_vector_from_position_counts,
)
from specdec_tune.search.formulas import (
    expected_tokens,
    expected_tokens_iid,
    predicted_speedup,
    speedup_iid,
    verify_cost_ms,
)


def model(t_target, verify, drafts, loop_overhead_ms=None, step_overhead_ms=None):
    """A CostModel over costs with these drafts: {name: (t_draft_ms, acceptance_vector)}."""
    costs = Costs(
        t_target_ms=t_target,
        t_target_spread=0.0,
        verify_ms=list(verify),
        verify_spread=0.0,
        context_len=64,
        drafts=[DraftCosts(n, t, t / t_target, 0.5, list(v)) for n, (t, v) in drafts.items()],
        loop_overhead_ms=loop_overhead_ms,
        step_overhead_ms=step_overhead_ms,
    )
    return CostModel(costs)


def best_gamma(t_target, t_draft, verify, vector, max_gamma, loop=None, step=None):
    return model(t_target, verify, {"d": (t_draft, vector)}, loop, step).best_gamma("d", max_gamma)


STEPS = 200_000
# With 200k steps the standard error of the mean is < 0.2% of it, so 1% is a > 5-sigma bound.
REL_TOL = 0.01


def simulate_accept_lengths(vector: list[float], gamma: int, seed: int) -> np.ndarray:
    """Draft gamma tokens per step; token i survives with prob vector[i] given 1..i-1 survived."""
    rng = np.random.default_rng(seed)
    probs = np.array([vector[min(i, len(vector) - 1)] for i in range(gamma)])
    accepted = rng.random((STEPS, gamma)) < probs
    # The first rejection ends the step: count the leading run of accepts.
    return np.cumprod(accepted, axis=1).sum(axis=1)


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_iid_closed_form_matches_simulation(alpha, gamma):
    lengths = simulate_accept_lengths([alpha], gamma, seed=gamma * 100 + int(alpha * 100))
    simulated = lengths.mean() + 1  # the target always adds one token (correction or bonus)
    assert expected_tokens_iid(alpha, gamma) == pytest.approx(simulated, rel=REL_TOL)


def test_non_iid_vector_matches_simulation():
    vector = [0.9, 0.75, 0.6, 0.5, 0.4]
    gamma = 7  # beyond the vector: positions 6 and 7 reuse 0.4
    lengths = simulate_accept_lengths(vector, gamma, seed=7)
    assert expected_tokens(vector, gamma) == pytest.approx(lengths.mean() + 1, rel=REL_TOL)


def test_acceptance_vector_recovered_from_simulated_lengths():
    vector = [0.9, 0.75, 0.6, 0.5]
    lengths = simulate_accept_lengths(vector, 4, seed=11).tolist()
    recovered = acceptance_vector_from_counts(lengths, 4)
    assert recovered == pytest.approx(vector, abs=0.01)
    # ...and the recovered vector predicts the observed mean exactly (it is the same counting).
    assert expected_tokens(recovered, 4) == pytest.approx(np.mean(lengths) + 1, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 0.9, 0.999999, 1.0])
@pytest.mark.parametrize("gamma", [0, 1, 2, 5, 10])
def test_iid_vector_reproduces_iid_formula(alpha, gamma):
    assert expected_tokens([alpha], gamma) == pytest.approx(expected_tokens_iid(alpha, gamma), rel=1e-12)
    assert expected_tokens([alpha] * gamma, gamma) == pytest.approx(
        expected_tokens_iid(alpha, gamma), rel=1e-12
    )


def test_edge_values():
    assert expected_tokens_iid(0.0, 5) == 1.0
    assert expected_tokens([0.0, 0.9], 5) == 1.0
    assert expected_tokens_iid(1.0, 4) == 5.0
    assert expected_tokens_iid(1.0 - 1e-12, 4) == pytest.approx(5.0, rel=1e-9)
    assert expected_tokens_iid(0.7, 0) == 1.0
    assert expected_tokens([], 5) == 1.0
    assert speedup_iid(0.8, 0, 0.5) == 1.0


def test_speedup_iid_matches_paper_example():
    # Leviathan et al. 2023, Thm 3.8: (1 - a^(g+1)) / ((1 - a)(g c + 1)).
    alpha, gamma, c = 0.8, 5, 0.05
    expected = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
    assert speedup_iid(alpha, gamma, c) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.2, 0.7, 0.9])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.3])
def test_predicted_speedup_reduces_to_leviathan(alpha, c):
    t_target = 20.0
    verify = [t_target] * 8  # the idealised "verification costs one target step"
    for gamma in range(0, 9):
        got = predicted_speedup(t_target, c * t_target, verify, [alpha], gamma)
        assert got == pytest.approx(speedup_iid(alpha, gamma, c), rel=1e-12)


def test_overheads_enter_numerator_and_denominator():
    verify = [10.0, 10.5, 11.0, 11.5]
    plain = predicted_speedup(10.0, 1.0, verify, [0.7], 3)
    e = expected_tokens([0.7], 3)
    # A plain loop that costs 2 ms per token besides the forward, a speculative step 3 ms.
    got = predicted_speedup(10.0, 1.0, verify, [0.7], 3, loop_overhead_ms=2.0, step_overhead_ms=3.0)
    assert got == pytest.approx((10.0 + 2.0) * e / (3 * 1.0 + 11.0 + 3.0), rel=1e-12)
    # Overhead only in the speculative step lowers the prediction; only in the plain loop raises it.
    assert predicted_speedup(10.0, 1.0, verify, [0.7], 3, step_overhead_ms=3.0) < plain
    assert predicted_speedup(10.0, 1.0, verify, [0.7], 3, loop_overhead_ms=3.0) > plain
    assert predicted_speedup(10.0, 1.0, verify, [0.7], 0, 5.0, 5.0) == 1.0
    # The same keywords flow through best_gamma and rank_configs; a large step overhead can make
    # "don't speculate" the answer.
    assert best_gamma(10.0, 0.1, [10.0] * 4, [0.3], 4, 0.0, 8.0) == (0, 1.0)
    ranked = model(10.0, verify, {"d": (1.0, [0.7])}, loop_overhead_ms=2.0, step_overhead_ms=3.0).rank(4)
    assert ranked[0][2] == pytest.approx(
        max(predicted_speedup(10.0, 1.0, verify, [0.7], g, 2.0, 3.0) for g in range(1, 5)), rel=1e-12
    )


def test_cost_model_reads_overheads_and_treats_missing_as_zero():
    verify = [10.0, 10.5, 11.0]
    with_loop = model(10.0, verify, {"d": (1.0, [0.7])}, loop_overhead_ms=0.25)
    assert with_loop.predict("d", 2) == pytest.approx(
        predicted_speedup(10.0, 1.0, verify, [0.7], 2, 0.25, 0.0)
    )
    bare = model(10.0, verify, {"d": (1.0, [0.7])})
    assert bare.predict("d", 2) == pytest.approx(predicted_speedup(10.0, 1.0, verify, [0.7], 2))
    assert bare.predict("d", 0) == 1.0 and bare.predict("unknown", 2) is None
    # The curve stops where the measurements stop: no extrapolation in a report.
    assert [g for g, _ in bare.curve("d")] == [1]
    assert [g for g, _ in bare.curve("d", 5)] == [1, 2, 3, 4, 5]


def test_verify_cost_extrapolates_linearly_and_never_downward():
    assert verify_cost_ms([10.0, 11.0, 12.5], 2) == 11.0
    assert verify_cost_ms([10.0, 11.0, 12.5], 5) == pytest.approx(12.5 + 1.5 * 2)
    assert verify_cost_ms([10.0, 9.0], 4) == 9.0  # noisy decreasing tail: held flat
    assert verify_cost_ms([10.0], 3) == 10.0
    with pytest.raises(SpecDecError):
        verify_cost_ms([], 1)


def test_best_gamma_picks_interior_optimum():
    # A cheap, good draft with verification cost growing in gamma: the optimum is inside 1..8.
    verify = [10.0 + 0.5 * g for g in range(1, 9)]
    gamma, speedup = best_gamma(10.0, 1.0, verify, [0.8], 8)
    brute = max(range(1, 9), key=lambda g: predicted_speedup(10.0, 1.0, verify, [0.8], g))
    assert gamma == brute
    assert 1 < gamma < 8
    assert speedup > 1.0


def test_best_gamma_returns_zero_when_draft_too_slow():
    # Draft as slow as the target with mediocre acceptance: never worth it.
    assert best_gamma(10.0, 10.0, [10.0] * 6, [0.5], 6) == (0, 1.0)
    assert best_gamma(10.0, 0.1, [10.0] * 6, [0.0], 6) == (0, 1.0)


def test_rank_configs_sorted_and_complete():
    verify = [10.0, 10.5, 11.0, 11.5]
    drafts = {"small": (1.0, [0.7]), "tiny": (0.3, [0.5]), "slow": (9.0, [0.6])}
    ranked = model(10.0, verify, drafts).rank(4)
    assert len(ranked) == 12
    speedups = [s for _, _, s in ranked]
    assert speedups == sorted(speedups, reverse=True)
    assert {(d, g) for d, g, _ in ranked} == {(d, g) for d in drafts for g in range(1, 5)}
    top_draft, top_gamma, top = ranked[0]
    assert (top_gamma, top) == best_gamma(10.0, drafts[top_draft][0], verify, drafts[top_draft][1], 4)


def test_acceptance_vector_from_counts_small_case():
    # gamma 3: lengths 0,1,2,3,3 -> position 1 proposed 5 accepted 4; pos 2: 4/3; pos 3: 3/2.
    assert acceptance_vector_from_counts([0, 1, 2, 3, 3], 3) == pytest.approx([4 / 5, 3 / 4, 2 / 3])


def test_acceptance_vector_never_reached_positions_are_nan_free():
    # Every step rejected at position 1: positions 2..3 were never proposed -> reuse 0.0.
    assert acceptance_vector_from_counts([0, 0, 0], 3) == [0.0, 0.0, 0.0]
    assert acceptance_vector_from_counts([], 2) == [0.0, 0.0]
    assert acceptance_vector_from_position_counts([10, 4, 0], [4, 2, 0]) == [0.4, 0.5, 0.5]
    assert acceptance_vector_from_position_counts([0, 0], [0, 0]) == [0.0, 0.0]


def test_position_counts_agree_with_lengths():
    lengths = [0, 1, 1, 2, 4, 4, 3, 0, 2]
    proposed = [sum(n >= i - 1 for n in lengths) for i in range(1, 5)]
    accepted = [sum(n >= i for n in lengths) for i in range(1, 5)]
    assert acceptance_vector_from_position_counts(proposed, accepted) == acceptance_vector_from_counts(
        lengths, 4
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: acceptance_vector_from_counts([4], 3),
        lambda: acceptance_vector_from_counts([-1], 3),
        lambda: acceptance_vector_from_position_counts([1, 2], [1]),
        lambda: acceptance_vector_from_position_counts([1], [2]),
        lambda: expected_tokens([1.5], 2),
        lambda: expected_tokens([math.nan], 2),
        lambda: expected_tokens_iid(0.5, -1),
        lambda: predicted_speedup(0.0, 1.0, [1.0], [0.5], 1),
        lambda: predicted_speedup(1.0, 1.0, [1.0], [0.5], 1, step_overhead_ms=-1.0),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(SpecDecError):
        call()


@settings(max_examples=200, deadline=None)
@given(
    vector=st.lists(st.floats(0.0, 1.0), min_size=0, max_size=8),
    gamma=st.integers(0, 15),
)
def test_expected_tokens_monotone_and_bounded(vector, gamma):
    now, more = expected_tokens(vector, gamma), expected_tokens(vector, gamma + 1)
    assert 1.0 <= now <= more
    assert now <= gamma + 1


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(0.0, 1.0), gamma=st.integers(0, 20))
def test_expected_tokens_iid_monotone_and_bounded(alpha, gamma):
    now = expected_tokens_iid(alpha, gamma)
    assert 1.0 - 1e-12 <= now <= expected_tokens_iid(alpha, gamma + 1) + 1e-9
    assert now <= gamma + 1 + 1e-9


def test_in_loop_clocks_replace_the_micro_benchmarks_at_batch_size_1():
    verify = [10.0, 11.0, 12.0, 13.0]
    plain = model(10.0, verify, {"d": (1.0, [0.7])})
    clocked = model(10.0, verify, {"d": (1.0, [0.7])})
    d = clocked.costs.drafts[0]
    # In the loop a draft token cost 1.5 ms and a verification over 5 tokens (γ 4) 15.6 ms, not 13.
    d.loop_t_draft_ms, d.loop_verify_ms, d.loop_verify_tokens = 1.5, 15.6, 5.0
    e = expected_tokens([0.7], 2)
    assert clocked.predict("d", 2) == pytest.approx(10.0 * e / (2 * 1.5 + 11.0 * 1.2), rel=1e-12)
    assert clocked.predict("d", 2) < plain.predict("d", 2)


def test_batch_predictions_use_the_surface_and_its_loop_clocks():
    from specdec_tune.domain import BatchCosts

    m = model(10.0, [10.0, 10.5, 11.0], {"d": (1.0, [0.7])})
    m.costs.batch = [BatchCosts(8, 20.0, [24.0, 28.0, 32.0], {"d": 2.0})]
    e = expected_tokens([0.7], 2)
    assert m.predict("d", 2, 8) == pytest.approx(20.0 * e / (2 * 2.0 + 28.0), rel=1e-12)
    assert m.predict("d", 2, 4) is None and m.curve("d", 3, 4) == []  # B = 4 was not profiled
    b = m.costs.batch[0]
    b.loop_overhead_ms, b.step_overhead_ms = 1.0, {"d": 3.0}
    b.loop_verify_ms, b.loop_verify_tokens, b.loop_t_draft_ms = {"d": 35.0}, {"d": 3.0}, {"d": 2.5}
    # In the loop: verifying 3 tokens per row took 35 ms where the micro-benchmark said 28 (x1.25).
    assert m.predict("d", 2, 8) == pytest.approx(21.0 * e / (2 * 2.5 + 28.0 * 1.25 + 3.0), rel=1e-12)
    b.verify_ms, b.loop_verify_ms = [40.0, 50.0, 60.0], {}
    assert m.b_star(3) == 8  # verification got expensive: nothing beats plain decoding at B = 8


def test_the_ceiling_is_the_prediction_with_every_draft_token_accepted():
    from specdec_tune.domain import Costs, DraftCosts

    draft = DraftCosts(
        name="d", t_draft_ms=1.0, c=0.1, acceptance_rate=0.5, acceptance_vector=[0.5, 0.5, 0.5]
    )
    costs = Costs(t_target_ms=10.0, t_target_spread=0.0, verify_ms=[10.0, 12.0, 15.0], verify_spread=0.0,
                  context_len=64, drafts=[draft])  # fmt: skip
    model = CostModel(costs)
    # gamma 3, all accepted: 4 tokens per step of 3 x 1 ms drafting + 15 ms verification
    assert model.ceiling("d", 3) == pytest.approx(10 * 4 / (3 + 15))
    assert model.ceiling("d", 3) > model.predict("d", 3)
    # a policy drafting at most 3 may draft fewer: the best bound over gamma 1..3
    assert model.ceiling("d", 3, policy="heuristic") == pytest.approx(
        max(10 * (g + 1) / (g + v) for g, v in ((1, 10), (2, 12), (3, 15)))
    )
    assert model.ceiling("unknown", 3) is None
