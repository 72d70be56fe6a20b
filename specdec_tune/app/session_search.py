"""One measuring session's search: open the session, profile its costs, search at each batch size
within the budget left, and build the profile (not written). `app.tuning.tune` writes it;
`app.envelope` runs one per context length and writes one profile of them all."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..backends.base import Models, Progress, Purpose, open_session
from ..backends.protocols import MeasuringSession, Schedules
from ..domain import Anchors, Config, Costs, Noise
from ..errors import SpecDecError
from ..measure.hardware import hardware_info, same_hardware
from ..measure.noise import busy, os_snapshot
from ..measure.seam import Case
from ..runtime.workloads import stratified
from ..search.budget import after_probe
from ..search.cells import later_candidates
from ..search.costmodel import CostModel
from ..search.enginepredictor import Predictor
from ..search.results import TuneResult, prediction_error
from ..search.space import TuneSettings
from ..search.tuner import tune as run_search
from ..store.build import EngineFields, batch_row, build_profile, with_batch_table, workload_info
from ..store.runfiles import check_replaceable
from ..store.schema import Profile
from ..store.yamlio import load_costs
from .common import adapt_to_noise, check_writable, trial_params, watched
from .reference import process_seconds
from .run_options import SearchInputs
from .session_engine import batched, cost_model_fit, default_rows, enqueue_predictions
from .session_plan import SessionPlan, cell_budget, keep_for_reference_rows, plan_session


class Ledger:
    """Where a session's wall time went, phase by phase (seconds since the last mark), for the
    profile (`search.time_spent`) and the budget note: a run over its budget says which phase took
    the time."""

    def __init__(self, started: float) -> None:
        self.spent: dict[str, float] = {}
        self._last = started

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.spent[phase] = round(self.spent.get(phase, 0.0) + now - self._last, 1)
        self._last = now

    def split(self, phase: str, part: str, seconds: float) -> None:
        """Move `seconds` of `phase` (already marked) to `part`."""
        seconds = round(min(max(0.0, seconds), self.spent.get(phase, 0.0)), 1)
        if seconds > 0:
            self.spent[part] = seconds
            self.spent[phase] = round(self.spent[phase] - seconds, 1)

    def note(self) -> str:
        total = sum(self.spent.values())
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in self.spent.items() if v >= 0.5)
        return f"{total:.0f} s went to: {parts}"


@dataclass
class SessionRun:
    """One session's search at each batch size, its profile built and not yet written."""

    profile: Profile
    out: Path
    results: dict[int, TuneResult]  # batch size -> its search
    trial_rows: list[dict[str, Any]]
    noise: Noise
    fresh_reference: bool
    threads: int | None = None  # the engine's threads: the reference processes run as many
    reference_s: float = 0.0  # the budget's reserve for those processes, planned before the search
    prompt_tokens: int = 0
    costs: Costs | None = None  # measured in this session (None: --no-profile)
    predictor: Predictor | None = (
        None  # the engine's model fitted from its trials (None: the closed-form model)
    )
    slices: bool = False  # the reference runs on the check slice (measure.narrow): the session's `slices`


def search_session(
    models: Models,
    settings: TuneSettings,
    inputs: SearchInputs,
    out: Path | None,
    progress: Progress,
    *,
    batch_sizes: list[int],
    budget_s: float | None,
    started: float,
    confirm: tuple[str, TuneResult] | None = None,
    carry: SessionRun | None = None,
) -> SessionRun:
    """Open `models`' measuring session, profile its costs, search at each batch size within what
    is left of `budget_s` (counted from `started`), and build the profile; nothing is written.
    `confirm` (a cell's name and its search.results.TuneResult, app.envelope): in a budgeted run
    the first batch size is not searched either; `every_draft` of that cell and the engine's
    defaults race there instead. `carry` (an envelope's first length's run): its costs go to the
    session's cost profile, which measures again only what changes with the context, and its
    engine model, carried to this length's costs, predicts until a trial here is measured
    (search.enginepredictor)."""
    purpose = Purpose("tune", tuple(inputs.layer_skip or ()), batch_sizes[0])
    ledger = Ledger(time.monotonic())
    with open_session(models, purpose) as s:
        settings = s.settings_for(settings, progress)
        if settings.screen_prompts and not s.screens:
            progress.note(f"--screen-prompts: the {s.name} backend measures every prompt of a trial")
        hw = hardware_info(s.device)
        out = out or s.profile_path(hw["slug"], models.target)
        check_writable(out)
        check_replaceable(out, s.content_hash(), settings.force)  # before minutes of measuring
        s.begin(settings, _key(s, models, hw["slug"], settings, batch_sizes[0]))
        ledger.mark("opening the engine")
        costs = _session_costs(s, settings, inputs, hw, progress, batch_sizes, carry)
        ledger.mark("costs")
        # How noisy the machine is (and how fast: the anchors `check` compares), before the search.
        noise, anchors = s.noise_and_anchors()
        ledger.mark("noise and anchors")
        settings, line = adapt_to_noise(settings, noise)
        if line:
            progress.note(line)
        # The reference processes `check` will judge against (app.reference) come out of the
        # budget too; on a busy machine there are none (`_reference`), unless on the check slice.
        reserve_s, sliced = 0.0, s.slices and hw.get("kind") == "cpu"
        referenced = (
            (s.fresh_reference or sliced) and settings.reference_processes and (sliced or not busy(noise))
        )
        if referenced:
            reserve_s = settings.reference_processes * process_seconds(noise.plain_pass_s)
        cells = _Cells(s, models, hw["slug"], settings, progress, costs, s.first_trials(settings.max_gamma))
        # The engine's own defaults race in the final round at the first batch size, so the answer
        # is never below them and the profile shows them beside it (`engine_defaults`).
        cells.defaults = s.default_configs() if settings.finalists else []
        cells.predictor = _carried_predictor(s, costs, carry)
        cells.plan = plan_session(
            s, settings, costs, noise.plain_pass_s, batch_sizes=batch_sizes, budget_s=budget_s,
            started=started, reserve_s=reserve_s, defaults=cells.defaults, confirm=confirm, progress=progress,
        )  # fmt: skip
        if referenced and sliced and len(batch_sizes) > 1:  # on the slice they measure every row too
            reserve_s += keep_for_reference_rows(cells.plan, s, settings.reference_processes, progress)
        watch = os_snapshot()  # what else the machine does during the search and final round
        for i, b in enumerate(batch_sizes):
            _search_cell(cells, i, b)
            ledger.mark(f"B={b}: final round")
            trials_s = sum(r.get("duration_s") or 0.0 for r in cells.results[b].rows)
            ledger.split(f"B={b}: final round", f"B={b}: trials", trials_s)
        schedule = None
        if len(batch_sizes) > 1 and isinstance(s, Schedules):  # the engine runs its answer as a schedule
            progress.stage("the batch-size schedule, measured against each fixed γ", 0.0)
            schedule = s.batch_schedule(cells.results, cells.plan.case, settings.repeats)
            ledger.mark("the schedule")
        noise = watched(noise, watch, progress, s.busy_rule)
        first = cells.results[batch_sizes[0]]
        exact = s.exactness(first, cells.plan.case)
        ledger.mark("exactness")
        fields = s.engine_fields(first, out.parent, models.target)
        model = s.batch_model(costs)
    if fields.backend.as_dict():  # an engine that describes itself (ours: `backend: {}`)
        fields.backend = replace(
            fields.backend, exactness=exact, cost_model_error=prediction_error(first),
            engine_defaults=default_rows(first, cells.defaults) if cells.defaults else [],
            cost_model=cost_model_fit(first, cells.predictor) if cells.predictor is not None else {},
            schedule=schedule or {},
        )  # fmt: skip
    profile = _session_profile(cells, fields, hw, noise, anchors, model, out)
    profile.search.time_spent = dict(ledger.spent)
    if profile.search.budget_note:
        profile.search.budget_note += "; " + ledger.note()
    trial_rows = [{**row, "batch_size": b} for b in batch_sizes for row in cells.results[b].rows]
    return SessionRun(
        profile, out, cells.results, trial_rows, noise, s.fresh_reference, s.threads, reserve_s,
        s.prompt_tokens, costs, cells.predictor, slices=sliced,
    )  # fmt: skip


def _session_costs(
    s: MeasuringSession,
    settings: TuneSettings,
    inputs: SearchInputs,
    hw: dict[str, Any],
    progress: Progress,
    batch_sizes: list[int],
    carry: SessionRun | None,
) -> Costs | None:
    """The session's costs: read from `inputs.costs_file` (measured on this hardware), else profiled here
    (an envelope's later length carries its first length's), or none with `--no-profile`."""
    if inputs.costs_file is not None:
        costs, costs_hw = load_costs(inputs.costs_file)
        if not same_hardware(costs_hw, hw):
            raise SpecDecError(
                f"{inputs.costs_file} was measured on {costs_hw.get('slug')}, this is {hw['slug']}"
            )
        s.use_costs(costs)
        return costs
    if inputs.no_profile:
        return None
    return s.costs(settings.max_gamma, 5, progress, batch_sizes, carry=carry.costs if carry else None)


def _carried_predictor(
    s: MeasuringSession, costs: Costs | None, carry: SessionRun | None
) -> Predictor | None:
    """The engine's model fitted from trials (None: the closed-form model), seeded with what an
    envelope's first length fitted, carried to this length's costs."""
    predictor = s.predictor() if costs is not None else None
    if predictor is not None and carry is not None and carry.predictor is not None and carry.costs:
        predictor.carry_from(carry.predictor, carry.costs, costs)
    return predictor


@dataclass
class _Cells:
    """One session's search over its batch sizes as it goes: what each cell searched or raced."""

    s: MeasuringSession
    models: Models
    hw_slug: str
    settings: TuneSettings
    progress: Progress
    costs: Costs | None
    neighbour: list[dict[str, Any]]  # trial params tried first: the previous batch size's winner
    defaults: list[Config] = field(default_factory=list)
    predictor: Predictor | None = None
    plan: SessionPlan = field(init=False)
    results: dict[int, TuneResult] = field(default_factory=dict)  # batch size -> its search
    notes: list[str] = field(default_factory=list)  # the budget's, one per cell

    def predictor_at(self, i: int, batch_size: int) -> Predictor | None:
        return self.predictor if i == 0 else batched(self.predictor, batch_size, self.costs)


def _search_cell(c: _Cells, i: int, b: int) -> None:
    """The i-th batch size: its settings fitted to its share of the budget, then a confirming race
    or a search."""
    plan, s, settings = c.plan, c.s, c.settings
    settings_b = replace(settings, batch_size=b)
    if settings.study_name and b != plan.batch_sizes[0]:
        settings_b.study_name = f"{settings.study_name}-b{b}"
    candidates: list[Config] = []
    if plan.confirms(i):
        candidates = (
            plan.first_pinned
            if i == 0
            else later_candidates(c.results[plan.batch_sizes[0]], bool(plan.first_from), plan.later_top)
        )
    if plan.budgeted:
        pinned = len(candidates) if plan.confirms(i) else len(c.defaults) if i == 0 else 0
        settings_b, note = cell_budget(plan, s, i, settings_b, pinned)
        c.notes.append(note)
    if plan.confirms(i):
        _confirm_cell(c, i, b, settings_b, candidates)
    else:
        _searched_cell(c, i, b, settings_b)


def _confirm_cell(c: _Cells, i: int, b: int, settings_b: TuneSettings, candidates: list[Config]) -> None:
    """A confirming cell: its own study races `candidates` head to head against plain (the configs
    it raced are part of what it answers)."""
    s, plan = c.s, c.plan
    key_b = {
        **_key(s, c.models, c.hw_slug, c.settings, b, plan.case),
        "confirms": [x.label for x in candidates],
    }
    c.results[b] = run_search(
        s, s.specs, plan.case, settings_b, None if s.fits_costs_from_trials else c.costs, study_key=key_b,
        on_trial=c.progress.trial, on_final=c.progress.final, pinned=candidates,
        predictor=c.predictor_at(i, b),
    )  # fmt: skip
    first_from = plan.first_from
    c.results[b].confirmed_from = first_from[0] if i == 0 and first_from else f"B={plan.batch_sizes[0]}"
    _record_flags(s, c.results[b], b, c.progress)


def _searched_cell(c: _Cells, i: int, b: int, settings_b: TuneSettings) -> None:
    """A searched cell: the probe trials first where the engine's costs come from them, then the
    search (and the engine's defaults raced at the first batch size)."""
    s, plan = c.s, c.plan
    key_b = _key(s, c.models, c.hw_slug, c.settings, b, plan.case)
    costs_b = c.costs
    if s.fits_costs_from_trials:
        # The engine's acceptance comes from the first trials (one per draft); the cost model's
        # best predictions, fed with it, are tried next, then TPE. The cost surface over B is not
        # measured in such an engine: no costs beyond B = 1.
        costs_b = None
        if c.costs is not None and b == 1:
            costs_b, settings_b = _probe(c, c.costs, settings_b, key_b)
    c.results[b] = run_search(
        s, s.specs, plan.case, settings_b, costs_b, study_key=key_b, on_trial=c.progress.trial,
        on_final=c.progress.final, extra_seeds=c.neighbour, pinned=c.defaults if i == 0 else None,
        predictor=c.predictor_at(i, b),
    )  # fmt: skip
    _record_flags(s, c.results[b], b, c.progress)
    c.neighbour = [trial_params(c.results[b].results[0].config), *s.first_trials(c.settings.max_gamma)]


def _probe(
    c: _Cells, costs: Costs, settings_b: TuneSettings, key_b: dict[str, Any]
) -> tuple[Costs, TuneSettings]:
    """The probe trials, measured whole (their screens reported, never pruned): each draft's
    acceptance and timings fit the model, and later trials' screens are compared with theirs.
    Returns the costs with the trials' acceptance and the settings the probe's time leaves."""
    s = c.s
    first = replace(
        settings_b, trials=min(settings_b.trials or 20, 1 + len(s.specs)), finalists=0, screen_prunes=False
    )
    probe_started = time.monotonic()
    probe = run_search(
        s, s.specs, c.plan.case, first, study_key=key_b, on_trial=c.progress.trial,
        extra_seeds=c.neighbour, predictor=c.predictor,
    )  # fmt: skip
    costs_b = s.with_trial_acceptance(costs, probe, c.settings.max_gamma)
    enqueue_predictions(probe, s, costs_b, settings_b, c.predictor)
    if c.plan.budgeted:
        elapsed = time.monotonic() - probe_started
        settings_b = after_probe(settings_b, elapsed, probe.trials, s.trial_shape.min_trials)
    return costs_b, settings_b


def _session_profile(
    c: _Cells,
    fields: EngineFields,
    hw: dict[str, Any],
    noise: Noise,
    anchors: Anchors,
    model: CostModel | None,
    out: Path,
) -> Profile:
    """The session's profile: the first batch size's answer, what was measured (all its prompts,
    or the first k when the budget cut them), the budget's notes and the batch table."""
    s, plan, settings, results = c.s, c.plan, c.settings, c.results
    first = results[plan.batch_sizes[0]]
    measured = s.workload
    if len(plan.case.prompts) < len(s.case.prompts):
        measured = replace(s.workload, prompts=stratified(s.workload.prompts, len(plan.case.prompts)))
    workload = replace(workload_info(measured, plan.case), context_length=c.models.context_length)
    profile = build_profile(
        first, settings, hw, fields, workload=workload, costs=c.costs, noise=noise, anchors=anchors,
    )  # fmt: skip
    if plan.budgeted:
        profile.search.budget_s = plan.budget_s
        profile.search.budget_note = "; ".join(c.notes)
    if plan.batch_sizes != [1]:
        rows = [batch_row(b, results[b], model, settings.max_gamma) for b in plan.batch_sizes]
        predicted = model.b_star(settings.max_gamma) if model is not None else None
        profile = with_batch_table(profile, rows, predicted)
    return s.portable(profile, out, c.models.target)


def _record_flags(s: MeasuringSession, result: TuneResult, batch_size: int, progress: Progress) -> None:
    """The exact flags an engine backend ran for each result (none for ours), and a line per trial
    this worker lost to a peer while it was paused."""
    for r in result.results:
        flags = s.flags(r.config, batch_size)
        if flags is not None:
            r.backend_args = flags
    for n in result.lost:
        progress.note(
            f"trial {n} was failed by another worker while this one was paused; its result is dropped"
        )


def _key(
    s: MeasuringSession,
    models: Models,
    hardware_slug: str,
    settings: TuneSettings,
    batch_size: int,
    case: Case | None = None,
) -> dict[str, Any]:
    """The study's identity: the session's, the context length its prompts were fitted to, and the
    prompts and reply lengths a pass measures when the budget cut them (`case`)."""
    key = s.study_key(hardware_slug, settings, batch_size)
    if models.context_length is not None:
        key = {**key, "context_length": models.context_length}
    if case is not None and len(case.prompts) < len(s.case.prompts):
        key = {**key, "trial_prompts": len(case.prompts)}
    if case is not None and max(case.max_new_tokens) < max(s.case.max_new_tokens):
        key = {**key, "trial_tokens": max(case.max_new_tokens)}
    return key
