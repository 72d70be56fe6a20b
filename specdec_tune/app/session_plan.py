"""The plan of one session's search, made before any search (docs/architecture.md, the budget):
whether the run is budgeted, which batch sizes are searched and which confirm configs that won
elsewhere, one plain pass measured at each batch size, and the trial cut to the prompts and reply
lengths the least search affords at every batch size; then each cell's share of what is left."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..backends.protocols import MeasuringSession, Progress, Schedules
from ..domain import Config, Costs
from ..measure.seam import Case
from ..measurepolicy import MEASURE_POLICY
from ..runtime.workloads import stratified
from ..search.budget import Cell, cells_trial_size, first_cell_share, fit_budget, least_seconds, pass_share
from ..search.cells import CONFIRM_RACED, CONFIRM_TOP, every_draft, union
from ..search.pruning import screen_prompts, screened_share
from ..search.space import TuneSettings
from .reference import process_seconds

if TYPE_CHECKING:
    from ..search.results import TuneResult


@dataclass
class SessionPlan:
    """What the search at each batch size of one session does and within what time."""

    settings: TuneSettings  # the session's settings (its engine's, adapted to the noise)
    costs: Costs | None  # what the expected speedups are planned on
    batch_sizes: list[int]
    budget_s: float | None
    started: float  # when the budget started (time.monotonic)
    reserve_s: float  # kept for the reference processes `check` judges against (app.reference)
    budgeted: bool  # a time budget decides the trials (no --trials, TPE)
    # A budgeted run searches its first batch size; each later one races the first's top configs
    # head to head against plain there (`confirm_candidates`), marked in the profile.
    confirming: bool
    first_from: tuple[str, TuneResult] | None  # the first batch size confirms another cell's (app.envelope)
    first_pinned: list[Config]  # what the first batch size races beside its search
    pass_by_b: dict[int, float]  # one plain pass over the whole workload at each batch size
    n: int  # the whole workload's prompts
    tokens: int  # its longest reply
    case: Case  # what a pass sends: the whole workload, or the first k prompts of t tokens
    cut: str = ""  # how the budget cut a trial ("" when it did not)
    later_top: int = CONFIRM_TOP  # configs a later batch size races after a search (`_fewer_later`)

    def confirms(self, i: int) -> bool:
        """Whether the i-th batch size races configs that won elsewhere instead of searching."""
        return self.confirming and (i > 0 or self.first_from is not None)

    def left_s(self) -> float:
        """Seconds of the budget left, the reference processes' reserve aside."""
        assert self.budget_s is not None
        return self.budget_s - (time.monotonic() - self.started) - self.reserve_s

    def cells(self, s: MeasuringSession, k: int, t: int) -> list[Cell]:
        """Each batch size as a cell of the budget, a pass cut to k prompts of t tokens."""
        out = []
        for i, b in enumerate(self.batch_sizes):
            share = pass_share(s.trial_shape, b, k, self.n, t, self.tokens)
            planned = replace(self.settings, batch_size=b)
            searched = not self.confirming or (i == 0 and self.first_from is None)
            pinned = (
                len(self.first_pinned)
                if i == 0
                else 0
                if searched
                else CONFIRM_RACED
                if self.first_from
                else self.later_top
            )
            out.append(
                Cell(
                    planned,
                    self.pass_by_b[b] * share,
                    s.expected_speedup(self.costs, planned),
                    pinned,
                    searched,
                )
            )
        return out


def plan_session(
    s: MeasuringSession,
    settings: TuneSettings,
    costs: Costs | None,
    plain_pass_s: float,
    *,
    batch_sizes: list[int],
    budget_s: float | None,
    started: float,
    reserve_s: float,
    defaults: list[Config],
    confirm: tuple[str, TuneResult] | None,
    progress: Progress,
) -> SessionPlan:
    """The plan, the trial cut included: one plain pass at each batch size, measured once, so that
    the least every batch size does fits, not only the first (a 240 s code-edit run at B = 1,4 in
    llama.cpp took 511 s when B = 4's passes were first seen after B = 1's search)."""
    budgeted = budget_s is not None and settings.trials is None and settings.sampler == "tpe"
    confirming = budgeted and settings.finalists > 0 and (len(batch_sizes) > 1 or confirm is not None)
    first_from = confirm if confirming else None
    first_pinned = (
        union(every_draft(first_from[1], s.specs, settings.max_gamma), defaults) if first_from else defaults
    )
    pass_by_b = _pass_times(s, plain_pass_s, batch_sizes) if budgeted else {}
    plan = SessionPlan(
        settings, costs, batch_sizes, budget_s, started, reserve_s, budgeted, confirming, first_from,
        first_pinned, pass_by_b, len(s.case.prompts), max(s.case.max_new_tokens), s.case,
    )  # fmt: skip
    if budgeted and plan.n > 1:
        _cut_trial(plan, s, progress)
    if budgeted and len(batch_sizes) > 1 and isinstance(s, Schedules):
        _keep_for_schedule(plan, s, progress)
    if confirming and first_from is None and len(batch_sizes) > 1:
        _fewer_later(plan, s, progress)
    return plan


def _fewer_later(plan: SessionPlan, s: MeasuringSession, progress: Progress) -> None:
    """Where the least of every cell, the trial as cut, is still over what is left, a later batch
    size races the CONFIRM_RACED fastest configs of the first (not the best of each draft first):
    a side of such a race is `final_repeats` passes at that size, and those are the run's longest
    (vLLM on a 2-core AVX2 CPU: 16.6 s a plain pass at B = 16, whose race of three configs took
    438 s of a 1 123 s run against a 600 s budget). The fastest two are also what a batch-size
    schedule chooses between (backends.vllm.schedule: the first size's best draft)."""
    k, t = len(plan.case.prompts), max(plan.case.max_new_tokens)
    left = plan.left_s()

    def least(cells: list[Cell]) -> float:  # each cell's pass already cut to k prompts of t tokens
        return sum(least_seconds(c, left / len(cells), s.trial_shape) for c in cells)

    whole = least(plan.cells(s, k, t))
    if whole <= left:
        return
    plan.later_top = CONFIRM_RACED
    fewer = least(plan.cells(s, k, t))
    progress.note(
        f"budget: each later batch size races the {CONFIRM_RACED} fastest configs of B={plan.batch_sizes[0]}, "
        f"not {CONFIRM_TOP}: the least of every batch size takes about {whole:.0f} s with {CONFIRM_TOP} "
        f"({fewer:.0f} s with {CONFIRM_RACED}), {max(left, 0.0):.0f} s of the budget left"
    )


def _keep_for_schedule(plan: SessionPlan, s: MeasuringSession, progress: Progress) -> None:
    """The schedule an engine measures after the cells (`Schedules`) comes out of the budget too:
    its time, planned on the trial's passes (as cut), is kept from what the cells share. Not from
    the cut itself: a trial is not cut below what the least search affords to make room for it."""
    assert isinstance(s, Schedules)
    k, t = len(plan.case.prompts), max(plan.case.max_new_tokens)
    passes = {
        b: pass_s * pass_share(s.trial_shape, b, k, plan.n, t, plan.tokens)
        for b, pass_s in plan.pass_by_b.items()
    }
    kept = s.schedule_seconds(passes, plan.settings.repeats)
    plan.reserve_s += kept
    progress.note(f"budget: about {kept:.0f} s kept for measuring the batch-size schedule after the cells")


def keep_for_reference_rows(
    plan: SessionPlan, s: MeasuringSession, processes: int, progress: Progress
) -> float:
    """The reference processes on the check slice measure every batch-table row too (app.reference):
    that time, planned on the trial's passes as cut (the profile's workload is the cut one, and the
    processes measure it), is kept from what the cells share, as the schedule's is. Not planned
    before the cut: on the uncut passes it took the whole of a 240 s budget at B = 1, 4, 16 and cut
    the trial to 2 prompts of 32 tokens. Returns the seconds kept."""
    k, t = len(plan.case.prompts), max(plan.case.max_new_tokens)
    kept = 0.0
    for b, pass_s in plan.pass_by_b.items():
        if b != 1:
            cut = pass_s * pass_share(s.trial_shape, b, k, plan.n, t, plan.tokens)
            kept += processes * (process_seconds(cut) - MEASURE_POLICY.reference_startup_s)
    plan.reserve_s += kept
    if kept:
        progress.note(
            f"budget: about {kept:.0f} s kept for the reference's batch-table rows on the check slice"
        )
    return kept


def _pass_times(s: MeasuringSession, plain_pass_s: float, batch_sizes: list[int]) -> dict[int, float]:
    """Seconds one plain pass over the whole workload takes at each batch size: the noise pass's at
    B = 1, one measured pass (after an untimed one) at any other."""
    return {b: plain_pass_s if b == 1 else s.pass_seconds(b) for b in batch_sizes}


def _cut_trial(plan: SessionPlan, s: MeasuringSession, progress: Progress) -> None:
    """A trial cut to the prompts, then the reply lengths, the least search affords at every batch
    size before anything else is: a long context or a slow engine must not take the budget 3x over.
    What `check` measures again: the first k prompts, stratified."""
    n, tokens = plan.n, plan.tokens
    k, t = cells_trial_size(plan.cells(s, n, tokens), plan.left_s(), s.trial_shape, n, tokens)
    if k < n or t < tokens:
        picked = stratified(s.workload.prompts, k)
        plan.case = s.case.pick(
            [next(i for i, p in enumerate(s.workload.prompts) if p is q) for q in picked], t
        )
        plan.cut = (
            f"each pass measures the first {k} of the {n} prompts"
            + (f", {t} new tokens each (not {tokens})" if t < tokens else "")
            + ", the most the least search affords"
            + (" at every batch size" if len(plan.batch_sizes) > 1 else "")
        )
        progress.note(f"budget: {plan.cut}")


def cell_budget(
    plan: SessionPlan, s: MeasuringSession, i: int, settings_b: TuneSettings, pinned: int
) -> tuple[TuneSettings, str]:
    """The i-th batch size's settings fitted to its share of the budget left (the first cell what
    the confirming cells' least leaves, each later one an equal share), and the note saying so."""
    b = settings_b.batch_size
    k_cut, t_cut = len(plan.case.prompts), max(plan.case.max_new_tokens)
    left = plan.left_s()
    left = (
        first_cell_share(plan.cells(s, k_cut, t_cut), left, s.trial_shape)
        if i == 0
        else left / (len(plan.batch_sizes) - i)
    )
    pass_s = plan.pass_by_b[b] * pass_share(s.trial_shape, b, k_cut, plan.n, t_cut, plan.tokens)
    expected = s.expected_speedup(plan.costs, settings_b)
    screen = screen_prompts(settings_b.screen_prompts, k_cut) if s.screens else 0
    settings_b, note = fit_budget(
        settings_b, left, pass_s, s.trial_shape, expected, pinned,
        screen_share=screened_share(screen, k_cut), searched=not plan.confirms(i),
    )  # fmt: skip
    return settings_b, note + (f"; {plan.cut}" if plan.cut and i == 0 else "")
