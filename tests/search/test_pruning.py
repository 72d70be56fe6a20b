"""The screen's pruner (search.pruning): successive halving at one step with a noise guard."""

from __future__ import annotations

import optuna
import pytest

from specdec_tune.search.pruning import make_pruner, screen_prompts, screened_out, screened_share


@pytest.mark.parametrize(
    ("asked", "prompts", "expected"),
    [(None, 6, 2), (None, 8, 3), (None, 3, 1), (None, 2, 0), (None, 1, 0), (0, 6, 0), (4, 6, 4), (6, 6, 0)],
)
def test_a_third_of_the_prompts_screen_a_trial_unless_asked_otherwise(asked, prompts, expected):
    assert screen_prompts(asked, prompts) == expected
    assert screened_share(expected, prompts) == (expected / prompts if expected else 0.0)


def test_only_a_config_outside_the_best_share_and_clearly_below_the_best_stops():
    # the best third of the field goes on, whatever its value
    assert not screened_out(1.30, [1.20, 1.10])
    # outside the best third but within 5 % of the best: noise could put it first, it goes on
    assert not screened_out(1.15, [1.20, 1.12])
    # outside it and more than 5 % below: clearly losing
    assert screened_out(0.93, [1.20, 1.12])
    # plain decoding counts: a first trial below plain by more than the margin stops
    assert screened_out(0.80, [])
    assert not screened_out(0.97, [])


def test_the_pruner_compares_trials_at_the_same_step_only():
    study = optuna.create_study(direction="maximize", pruner=make_pruner())
    for value in (1.30, 1.25, 1.28):
        t = study.ask()
        t.report(value, 2)
        study.tell(t, value)
    other_step = study.ask()
    other_step.report(2.0, 4)  # another screen size: not a competitor at step 2
    study.tell(other_step, 2.0)
    losing = study.ask()
    losing.report(1.0, 2)
    assert losing.should_prune()
    close = study.ask()
    close.report(1.27, 2)
    assert not close.should_prune()
    unscreened = study.ask()
    assert not unscreened.should_prune()  # nothing reported: nothing to judge
