"""Cheap trials: a trial measures its first prompts first (measure.seam.Screen), reports the speedup
over them to the study's pruner, and only a config that is still in the running measures the rest.

The pruner is successive halving at one rung with a noise guard. At the screen's step (the prompts
measured so far), a trial goes on when it is among the best 1/`reduction_factor` of the trials
that reached that step (itself and plain decoding, 1.0 on any prompts, included), or when it is
within `margin` of the best of them: screened values of the same prompts are compared with each
other, never with a whole-workload speedup (the first prompts of a workload may be easier).

    screen values 1.20, 1.12, 1.00 (plain); this one 1.15, reduction 3, margin 5 %:
        not in the best third (1 of 4), but within 5 % of 1.20            -> goes on
    this one 0.93: neither                                                  -> pruned
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

SCREEN_SHARE = 1 / 3  # the share of a workload's prompts a trial screens first (auto)
MIN_SCREEN_PROMPTS = 3  # fewer prompts than this: no screen, every trial measures them all
# The budget plans on this share of trials going past the screen: cheap trials buy more of them,
# and the timeout, not the plan, stops the search when more survive (search.budget).
PLANNED_SURVIVAL = 0.5


def screen_prompts(asked: int | None, prompts: int) -> int:
    """The prompts a trial screens first: `asked` (0: no screen), else a third of the workload's,
    at least one; none below MIN_SCREEN_PROMPTS prompts or when the screen would be all of them."""
    if asked is not None:
        return asked if 0 < asked < prompts else 0
    if prompts < MIN_SCREEN_PROMPTS:
        return 0
    return max(1, math.ceil(prompts * SCREEN_SHARE))


def screened_share(screen: int, prompts: int) -> float:
    """The share of a full trial's passes a trial pruned at its screen has run (0: no screen)."""
    return screen / prompts if 0 < screen < prompts else 0.0


def make_pruner(reduction_factor: int = 3, margin: float = 0.05) -> Any:
    """The study's pruner (an optuna BasePruner): `ScreenPruner`, built here so this module imports
    no Optuna until a study is opened."""
    import optuna

    class ScreenPruner(optuna.pruners.BasePruner):
        """Successive halving at the screen's step with a noise guard (this module's rule)."""

        def __init__(self) -> None:
            self.reduction_factor, self.margin = reduction_factor, margin

        def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
            step = trial.last_step
            if step is None:
                return False
            value = trial.intermediate_values[step]
            others = [
                t.intermediate_values[step]
                for t in study.get_trials(deepcopy=False)
                if t.number != trial.number and step in t.intermediate_values
            ]
            return screened_out(value, others, self.reduction_factor, self.margin)

    return ScreenPruner()


def screened_out(value: float, others: list[float], reduction_factor: int = 3, margin: float = 0.05) -> bool:
    """Whether a screened speedup `value` is clearly losing against `others` at the same step
    (plain decoding's 1.0 counts as one of them): outside the best 1/`reduction_factor` and more
    than `margin` below the best."""
    field = sorted([*others, 1.0, value], reverse=True)
    keep = max(1, len(field) // reduction_factor)
    if value >= field[keep - 1]:
        return False
    return value < field[0] * (1 - margin)
