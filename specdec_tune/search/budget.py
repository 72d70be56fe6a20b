"""How many trials a time budget buys, planned on the plain pass measured at run time.

One plan for every backend: what differs between engines is what a trial costs beside its timed
passes (a server start-up in llama.cpp, the study's bookkeeping in our engine) and whether each
finalist is timed against its own plain passes. Those are the engine's `TrialShape`, given by its
measuring session (`backends`); the arithmetic is here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..measurepolicy import MEASURE_POLICY
from .pruning import PLANNED_SURVIVAL
from .space import DEFAULT_TRIALS, TuneSettings

# The search needs the baseline, a few cost-model seeds and a few TPE trials to mean anything.
MIN_BUDGET_TRIALS = 6
# What a budget plans on at most: a pass never takes less than a quarter of a plain one.
MAX_EXPECTED_SPEEDUP = 4.0
RACE_FACTOR = 2.0  # the final round's racing gets at most as much again as its first round
FIRST_PASS_SHARE = 0.5  # the most of a budget the final round's first pass is planned to take


@dataclass(frozen=True)
class TrialShape:
    """What a trial costs an engine beside its timed passes.

    - `overhead_s`: seconds per trial outside any pass (our engine: the study's sampler and storage
      writes, 0.15 s; llama.cpp: a server start-up and its warm-up request, 1.5 s).
    - `warmup_passes`: untimed passes per trial, as a share of one plain pass (our engine warms the
      config and the baseline on one prompt each: 2 / prompts; llama.cpp's first pass is the whole
      workload, the exactness check, so 1).
    - `own_baseline`: each finalist is timed against its own plain passes, else the finalists share
      one baseline (both engines now: llama.cpp's finalists took their own until a quiet SmolLM2
      final round of 3 x 5 repeats took 96 s at 2.44 s a pass where one shared baseline planned 53 s,
      and a noisy one of 5 x 6 repeats 540 s at 5.19 s a pass).
    - `plans_speedup`: a speculative pass is planned as a plain one divided by the cost model's
      expected speedup (our engine); else as long as a plain one (llama.cpp on a CPU gains tens of
      per cent, not times, and its model is fitted only once trials ran).
    - `batch_requests`: a pass at B > 1 sends at least this many requests per slot, the workload
      cycling when it is shorter (llama.cpp's closed loop: 2, so every slot stays busy; ours: 1,
      `measure.batched.fill_slots`). A trial cut to fewer prompts than that
      takes no less: a B = 4 pass of 2 prompts still sent 8 requests, and a 240 s run at B = 1,4
      planned on 2/8 of a pass took 4 times that at B = 4.
    - `min_trials`: the least a search does, its baseline trial included (MIN_BUDGET_TRIALS). An
      engine whose trial is a server start and whose cost model ranks every config from the first
      trials asks fewer: vLLM, the baseline, each draft once and the model's best (a SmolLM2 run of
      6 trials at 85-120 s a start took 839 s of a 240 s budget).
    - `finalist_overhead_s`: what a finalist costs the final round beside its passes (None: a
      trial's `overhead_s`, a server started again). vLLM keeps the servers its trials started: 0,
      where planning a start per finalist gave the final round a racing budget of minutes.
    """

    overhead_s: float
    warmup_passes: float
    own_baseline: bool = False
    plans_speedup: bool = True
    batch_requests: float = 1.0
    min_trials: int = MIN_BUDGET_TRIALS
    finalist_overhead_s: float | None = None


def pass_share(
    shape: TrialShape, batch_size: int, k: int, prompts: int, t: int = 0, tokens: int = 0
) -> float:
    """The share of a whole-workload pass (`prompts` prompts, replies of `tokens`) that a pass of
    the first `k` prompts with replies of `t` takes at `batch_size` (`TrialShape.batch_requests`)."""
    floor = shape.batch_requests * batch_size if batch_size > 1 else 0.0
    return max(k, floor) / max(prompts, floor) * (t / tokens if tokens else 1.0)


MIN_TRIAL_PROMPTS = 2  # a trial of fewer prompts says too little about a workload
# When even the least cut does not fit, a cut that saves less than this share of the least search
# is not made: the trial's fixed overhead, not its passes, is what runs over.
CUT_WORTH_SHARE = 0.25
MIN_TRIAL_TOKENS = 32  # nor one of shorter replies: drafts that copy need some output to copy into


def prompts_that_fit(
    settings: TuneSettings,
    budget_s: float,
    pass_s: float,
    shape: TrialShape,
    prompts: int,
    expected_speedup: float | None = None,
    pinned: int = 0,
) -> int:
    """How many of a pass's `prompts` the search measures so that the least it does fits `budget_s`
    (`fit_budget`'s plan, a pass taking `pass_s` x k / prompts): all of them when they fit, else
    the most that do, never fewer than MIN_TRIAL_PROMPTS. The trial is cut before the final round's
    repeats are: a long context made one plain pass of six 2048-token prompts so slow that the least
    search of SmolLM2 in llama.cpp took over 6 minutes of an 80 s share."""
    return trial_size(settings, budget_s, pass_s, shape, prompts, 0, expected_speedup, pinned)[0]


def trial_size(
    settings: TuneSettings,
    budget_s: float,
    pass_s: float,
    shape: TrialShape,
    prompts: int,
    tokens: int,
    expected_speedup: float | None = None,
    pinned: int = 0,
) -> tuple[int, int]:
    """(k prompts, t new tokens each) a pass measures so that the least search fits `budget_s`: the
    prompts are cut first (`prompts_that_fit`), down to MIN_TRIAL_PROMPTS; then the replies, halved
    from `tokens` down to MIN_TRIAL_TOKENS and never below it (48 tokens are cut to 32: a native
    envelope's longer lengths raced 2 prompts of 48 tokens at 0 s of the budget left). A pass takes
    `pass_s` x k / prompts x t / tokens: its prompts are restored, not processed, so it is decode
    time. `tokens` 0: never cut. At
    6 107 tokens of context two SmolLM2 prompts of 128 tokens took 8 s a pass in llama.cpp, and
    a trial about 7 passes, against an 80 s share for the whole length."""

    return cells_trial_size(
        [Cell(settings, pass_s, expected_speedup, pinned)], budget_s, shape, prompts, tokens
    )


@dataclass(frozen=True)
class Cell:
    """One batch size of a run as the budget plans it: its settings, one plain pass over the whole
    workload there, the cost model's expected speedup, the pinned finalists it races, and whether
    it is searched (the first) or confirms the first's top configs (app.session_search)."""

    settings: TuneSettings
    pass_s: float
    expected_speedup: float | None = None
    pinned: int = 0
    searched: bool = True


def least_seconds(cell: Cell, budget_s: float, shape: TrialShape, share: float = 1.0) -> float:
    """The least `cell` does (its minimum trials and the final round's first pass), a pass being
    `share` of the whole workload's."""
    return _plan(
        cell.settings, budget_s, cell.pass_s * share, shape, cell.expected_speedup, cell.pinned,
        searched=cell.searched,
    )[2]  # fmt: skip


def cells_trial_size(
    cells: list[Cell], budget_s: float, shape: TrialShape, prompts: int, tokens: int
) -> tuple[int, int]:
    """`trial_size` over a run of several cells: (k prompts, t tokens) such that the least every
    cell does fits `budget_s` together. A run at B = 1,4 in llama.cpp took 511 s of a 240 s budget
    when B = 4's passes were first seen after B = 1's search."""

    def fits(k: int, t: int) -> bool:
        return (
            sum(
                least_seconds(
                    c,
                    budget_s / len(cells),
                    shape,
                    pass_share(shape, c.settings.batch_size, k, prompts, t, tokens),
                )
                for c in cells
            )
            <= budget_s
        )

    least = min(prompts, MIN_TRIAL_PROMPTS)
    k = next((k for k in range(prompts, least - 1, -1) if fits(k, tokens)), least)
    t = tokens
    while t > MIN_TRIAL_TOKENS and not fits(k, t):
        t = max(t // 2, MIN_TRIAL_TOKENS)
    if not fits(k, t) and _cut_saves(cells, budget_s, shape, prompts, tokens, k, t) < CUT_WORTH_SHARE:
        # Nothing fits, and the cut would save little: a trial's cost is its overhead (a vLLM
        # server's start, 40-60 s on a 2-core CPU), so a cut pass buys no trial and only noise (a
        # demo run in vLLM cut to 2 prompts of 32 tokens read its best 1.25x [0.99, 1.84]).
        return prompts, tokens
    return k, t


def _cut_saves(
    cells: list[Cell], budget_s: float, shape: TrialShape, prompts: int, tokens: int, k: int, t: int
) -> float:
    """The share of the least search's seconds that the cut to (k prompts, t tokens) saves."""

    def total(k: int, t: int) -> float:
        return sum(
            least_seconds(
                c,
                budget_s / len(cells),
                shape,
                pass_share(shape, c.settings.batch_size, k, prompts, t, tokens),
            )
            for c in cells
        )

    whole = total(prompts, tokens)
    return (whole - total(k, t)) / whole if whole > 0 else 0.0


def first_cell_share(cells: list[Cell], budget_s: float, shape: TrialShape) -> float:
    """The seconds the first (searched) cell gets of `budget_s`: what the confirming cells after it
    need at the least is kept back, and the search takes the rest; searched cells share evenly."""
    if all(c.searched for c in cells):
        return budget_s / len(cells)
    later = sum(least_seconds(c, budget_s / len(cells), shape) for c in cells[1:])
    return max(budget_s - later, budget_s / len(cells))


def fit_budget(
    settings: TuneSettings,
    budget_s: float,
    pass_s: float,
    shape: TrialShape,
    expected_speedup: float | None = None,
    pinned: int = 0,
    screen_share: float = 0.0,
    searched: bool = True,
) -> tuple[TuneSettings, str]:
    """Trials and a timeout that fit `budget_s` seconds at `settings.batch_size`, one plain pass over
    the workload taking `pass_s` here.

    A speculative pass takes a plain one divided by its speedup (`shape.plans_speedup`): the
    finalists' by the cost model's best prediction, a search trial's by its square root (the search
    tries configs between plain and the best). A trial is repeats x (its pass + the interleaved
    plain pass) plus its warm-up and overhead; the final round is at least two finalists and the
    baseline, each `final_repeats` times, and its racing rounds get what the search's minimum leaves,
    up to as much again. The timeout, not the count, is what keeps the search within the budget
    when trials run slower than expected; when even the least search does not fit, the note says
    the run will go over (a slow or busy machine is said, not hidden behind a cut final round).
    `pinned` finalists (an engine's defaults, search.final) race in the final round besides.
    `screen_share`: the share of a trial's passes it runs before its screen (search.pruning); a
    trial is then planned at that share plus PLANNED_SURVIVAL of the rest.
    """
    out, note, _ = _plan(settings, budget_s, pass_s, shape, expected_speedup, pinned, screen_share, searched)
    return out, note


def _plan(
    settings: TuneSettings,
    budget_s: float,
    pass_s: float,
    shape: TrialShape,
    expected_speedup: float | None = None,
    pinned: int = 0,
    screen_share: float = 0.0,
    searched: bool = True,
) -> tuple[TuneSettings, str, float]:
    """`fit_budget`'s plan, and the seconds the least search takes. `searched` False: a confirming
    cell (`Cell`), one baseline trial and its `pinned` candidates raced, nothing searched."""
    b = settings.batch_size
    planned = expected_speedup if shape.plans_speedup else None
    speedup = min(max(planned or 1.0, 1.0), MAX_EXPECTED_SPEEDUP)
    share = screen_share + PLANNED_SURVIVAL * (1 - screen_share) if 0 < screen_share < 1 else 1.0
    # a confirming cell's one trial is its baseline, a plain pass: the race measures plain again
    passes = (settings.repeats * (1 + speedup**-0.5) if searched else 1.0) + shape.warmup_passes
    trial_s = passes * share * pass_s + shape.overhead_s
    finalists = max(2, settings.finalists) + pinned if settings.finalists else 0
    if not searched:
        finalists = pinned
    least_trials = shape.min_trials if searched else 1
    own = 1.0 if shape.own_baseline else 0.0

    def first_pass_s(repeats: int) -> float:
        # each finalist's start-up, and the untimed exactness pass of a pinned one no trial measured
        each = shape.overhead_s if shape.finalist_overhead_s is None else shape.finalist_overhead_s
        fixed = finalists * each + pinned * shape.warmup_passes * pass_s
        return (1 + finalists * (1 / speedup + own)) * repeats * pass_s + fixed

    # Repeats the noise raised (app.common.adapt_to_noise) give way to the budget first: the first
    # pass gets at most FIRST_PASS_SHARE of it, never fewer repeats than asked or than the policy's min_pairs.
    repeats = settings.final_repeats
    least = max(MEASURE_POLICY.min_pairs, min(repeats, settings.final_repeats_asked or repeats))
    while finalists and repeats > least and first_pass_s(repeats) > FIRST_PASS_SHARE * budget_s:
        repeats -= 1
    first_s = first_pass_s(repeats)
    race_s = RACE_FACTOR * first_s
    if settings.final_repeats_cap is not None:  # `run --final-repeats N`: no racing past N repeats
        race_s = min(race_s, first_pass_s(settings.final_max_repeats))
    search_min_s = least_trials * trial_s
    final_s = min(race_s, max(first_s, budget_s - search_min_s)) if finalists else 0.0
    fits = int((budget_s - final_s) // trial_s) if trial_s > 0 else DEFAULT_TRIALS
    trials = max(shape.min_trials, min(DEFAULT_TRIALS, fits)) if searched else 1
    timeout = max(budget_s - final_s, search_min_s)
    if not searched:
        # a race gets what the budget holds beyond its baseline trial, up to RACE_FACTOR x its first
        # pass; over the budget, its first pass alone (a 2 B x 3 L llama.cpp envelope, 130 s over at
        # L = 2 048, spent 40 s more racing two configs at B = 4 that its planned first pass left)
        final_s = max(0.0, min(race_s, budget_s - search_min_s))
        out = replace(
            settings, trials=1, repeats=1, timeout_s=None, final_budget_s=final_s, final_repeats=repeats
        )
        note = (
            f"B={b}: {max(budget_s, 0.0):.3g} s of the budget left, one plain pass {pass_s:.3g} s, so "
            f"no search: {pinned} configs found at another cell raced head to head against plain"
        )
        least_s = search_min_s + first_s
        if least_s > budget_s:
            note += f" (about {least_s:.0f} s, more than that: expect it to run over)"
        return out, note, least_s
    note = (
        f"B={b}: {max(budget_s, 0.0):.3g} s of the budget left, one plain pass {pass_s:.3g} s"
        + (f", the cost model's best {planned:.2f}x" if planned else "")
        + (f", trials screened on {screen_share:.0%} of the prompts first" if share < 1 else "")
        + f", so {trials} trials"
        + (f" (fewer than the default {DEFAULT_TRIALS})" if trials < DEFAULT_TRIALS else "")
    )
    least_s = search_min_s + (first_s if finalists else 0.0)
    if least_s > budget_s:
        note += (
            f"; the least a search does ({shape.min_trials} trials"
            + (" and the final round's first pass" if finalists else "")
            + f", about {least_s:.0f} s) is more than that, so expect it to run over"
        )
    if repeats < settings.final_repeats:
        note += f"; the final round's first pass {repeats} repeats (the noise asked {settings.final_repeats})"
    final_budget = final_s if finalists else None
    out = replace(
        settings, trials=trials, timeout_s=timeout, final_budget_s=final_budget, final_repeats=repeats
    )
    return out, note, least_s


def after_probe(
    settings: TuneSettings, probe_s: float, probe_trials: int, least: int = MIN_BUDGET_TRIALS
) -> TuneSettings:
    """The search's timeout once its first trials (one per draft, which fit an engine's cost model
    from its own timings) took `probe_s`: they are part of the search, so their time comes out of
    it. The rest of the search still gets what the least a search does needs (`least` trials in
    all: the engine's `TrialShape.min_trials`), at the pace the first trials measured; what that
    takes beyond the timeout comes out of
    the final round's racing. A quiet SmolLM2 run in llama.cpp went 17 s over its 240 s budget
    before this."""
    if not settings.timeout_s or probe_trials <= 0:
        return settings
    floor = max(0, least - probe_trials) * probe_s / probe_trials
    left = settings.timeout_s - probe_s
    timeout = max(left, floor, 1e-3)  # never 0: a timeout of 0 means none at all (search.tuner)
    final = settings.final_budget_s
    if final is not None and timeout > left:  # the search's minimum runs over: racing gives it back
        final = max(0.0, final - (timeout - left))
    return replace(settings, timeout_s=timeout, final_budget_s=final)
