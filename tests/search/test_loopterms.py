"""The cost model's large-batch terms (issue 21): the budget cut (no drafting past a request's
end) and the in-loop verification growing with gamma, from synthetic costs."""

from __future__ import annotations

import math

import pytest
from helpers import make_costs

from specdec_tune.domain import BatchCosts
from specdec_tune.search.costmodel import CostModel, expected_tokens, predicted_speedup
from specdec_tune.search.loopterms import (
    VERIFY_GROWTH_PER_GAMMA,
    budget_steps,
    budget_tokens_per_step,
    emission_probabilities,
    loop_verify_growth,
)


def test_emission_probabilities_sum_to_one_and_match_expected_tokens():
    vector = [0.8, 0.6, 0.5]
    for g in range(0, 6):
        probs = emission_probabilities(vector, g)
        assert len(probs) == g + 1 and math.isclose(sum(probs), 1.0)
        mean = sum(j * p for j, p in enumerate(probs, 1))
        assert math.isclose(mean, expected_tokens(vector, g) if g else 1.0)
    assert emission_probabilities([], 3) == [1.0, 0.0, 0.0, 0.0]


def test_budget_cut_by_hand():
    # everything accepted, gamma 4, budget 7: a step of 5 tokens, then 2 left -> g = 1, 2 tokens
    assert budget_steps([1.0], 4, 7) == (2.0, 2.0)
    # nothing accepted: one token per step whatever gamma
    assert budget_steps([0.0], 4, 9)[0] == 9.0
    # budget 1: one step that drafts nothing
    steps, cost = budget_steps([0.9], 6, 1, step_cost=lambda g: 10.0 + g)
    assert (steps, cost) == (1.0, 10.0)
    # budget 2, a = 0.5: a step with g = 1 emits 2 (p .5) or 1 (p .5, then one more step)
    assert budget_steps([0.5], 4, 2) == (1.5, 1.5)


def test_budget_cut_lowers_tokens_per_step_more_at_large_gamma_and_vanishes_with_long_budgets():
    vector = [0.8, 0.75, 0.7, 0.68, 0.66, 0.64]
    cut = {g: budget_tokens_per_step(vector, g, [32]) / expected_tokens(vector, g) for g in (2, 4, 6)}
    assert 1.0 > cut[2] > cut[4] > cut[6] > 0.85
    long = budget_tokens_per_step(vector, 6, [100_000]) / expected_tokens(vector, 6)
    assert long == pytest.approx(1.0, abs=1e-3)


def test_verify_growth_is_one_at_the_calibration_width_and_linear_around_it():
    assert loop_verify_growth(4, 4) == 1.0
    assert loop_verify_growth(6, 4) == pytest.approx(1 + 2 * VERIFY_GROWTH_PER_GAMMA)
    assert loop_verify_growth(2, 4) == pytest.approx(1 - 2 * VERIFY_GROWTH_PER_GAMMA)
    assert loop_verify_growth(1, 100) == 0.5  # floored
    # the B = 16 ratios (1.10 / 1.26 / 1.39 at gamma 2 / 4 / 6) within 2 %
    for gamma, ratio in ((2, 1.10), (6, 1.39)):
        assert 1.26 * loop_verify_growth(gamma, 4) == pytest.approx(ratio, rel=0.02)


def _with_b16():
    costs = make_costs()
    d = costs.drafts[0]
    verify = [8.0 + 0.5 * g for g in range(1, 9)]
    costs.batch = [
        BatchCosts(
            16,
            7.5,
            verify,
            {d.name: 3.0},
            loop_overhead_ms=0.3,
            step_overhead_ms={d.name: 0.5},
            loop_verify_ms={d.name: 12.0},  # in-loop at width 5 (gamma 4): 12 ms vs micro 10
            loop_verify_tokens={d.name: 5.0},
        )
    ]
    return costs, d


def test_b16_prediction_uses_the_growing_verification_ratio():
    costs, d = _with_b16()
    model = CostModel(costs)
    scale = 12.0 / 10.0  # the ratio clocked at gamma 4
    for gamma in (2, 4, 6):
        c_ver = (8.0 + 0.5 * gamma) * scale * loop_verify_growth(gamma, 4)
        want = (7.5 + 0.3) * expected_tokens(d.acceptance_vector, gamma) / (gamma * 3.0 + c_ver + 0.5)
        assert model.predict(d.name, gamma, 16) == pytest.approx(want)
    # gamma 4 is where the loop was clocked: unchanged; above it the prediction drops
    flat = predicted_speedup(
        7.5, 3.0, [v * scale for v in costs.batch[0].verify_ms], d.acceptance_vector, 6, 0.3, 0.5
    )
    assert model.predict(d.name, 6, 16) < flat


def test_budgets_scale_the_b16_prediction_by_the_cut():
    costs, d = _with_b16()
    free, cut = CostModel(costs), CostModel(costs, budgets=[32, 16])
    for gamma in (2, 6):
        factor = budget_tokens_per_step(d.acceptance_vector, gamma, [32, 16]) / expected_tokens(
            d.acceptance_vector, gamma
        )
        assert cut.predict(d.name, gamma, 16) == pytest.approx(free.predict(d.name, gamma, 16) * factor)
        assert factor < 1.0


def test_budgets_at_b1_count_the_cheaper_cut_steps():
    costs, d = make_costs(), make_costs().drafts[0]
    free, cut = CostModel(costs), CostModel(costs, budgets=[24])
    got = cut.predict(d.name, 5)
    # by hand: time per request from the same recursion with each step's own g
    o_loop, o_step = costs.loop_overhead_ms, costs.step_overhead_ms

    def step(g):
        return g * d.t_draft_ms + (costs.verify_ms[g - 1] if g else costs.t_target_ms) + o_step

    _, ms = budget_steps(d.acceptance_vector, 5, 24, step)
    assert got == pytest.approx((costs.t_target_ms + o_loop) * 24 / ms)
    assert got != pytest.approx(free.predict(d.name, 5))  # the cut steps change the answer
    # an enormous budget converges to the free prediction
    assert CostModel(costs, budgets=[20_000]).predict(d.name, 5) == pytest.approx(
        free.predict(d.name, 5), rel=2e-3
    )
