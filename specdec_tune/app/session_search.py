"""One measuring session's search: open the session, profile its costs, search at each batch size
within the budget left, and build the profile (not written). `app.tuning.tune` writes it;
`app.envelope` runs one per context length and writes one profile of them all."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..backends.base import Models, Progress, Purpose, open_session
from ..backends.protocols import Schedules
from ..domain import FIXED_GAMMA, Config
from ..errors import SpecDecError
from ..measure.hardware import hardware_info, same_hardware
from ..measure.noise import busy, os_snapshot
from ..runtime.workloads import stratified
from ..search.budget import Cell, after_probe, cells_trial_size, first_cell_share, fit_budget, pass_share
from ..search.cells import CONFIRM_RACED, CONFIRM_TOP, every_draft, later_candidates, union
from ..search.costmodel import CostModel
from ..search.enginepredictor import BatchedPredictor
from ..search.pruning import screen_prompts, screened_share
from ..search.results import prediction_error, prediction_errors
from ..search.space import TuneSettings, seed_configs
from ..search.tuner import tune as run_search
from ..store.build import batch_row, build_profile, with_batch_table, workload_info
from ..store.runfiles import check_replaceable
from ..store.yamlio import load_costs
from .common import adapt_to_noise, check_writable, trial_params, watched
from .reference import process_seconds


@dataclass
class SessionRun:
    """One session's search at each batch size, its profile built and not yet written."""

    profile: Any  # store.schema.Profile
    out: Path
    results: dict[int, Any]  # batch size -> search.results.TuneResult
    trial_rows: list[dict[str, Any]]
    noise: Any
    fresh_reference: bool
    threads: int | None = None  # the engine's threads: the reference processes run as many
    prompt_tokens: int = 0
    costs: Any = None  # domain.Costs measured in this session (None: --no-profile)
    predictor: Any = None  # the engine's model fitted from its trials (None: the closed-form model)


def search_session(
    models: Models,
    settings: TuneSettings,
    layer_skip: list[int] | None,
    costs_file: Path | None,
    no_profile: bool,
    out: Path | None,
    progress: Progress,
    *,
    batch_sizes: list[int],
    budget_s: float | None,
    started: float,
    confirm: tuple[str, Any] | None = None,
    carry: Any = None,
) -> SessionRun:
    """Open `models`' measuring session, profile its costs, search at each batch size within what
    is left of `budget_s` (counted from `started`), and build the profile; nothing is written.
    `confirm` (a cell's name and its search.results.TuneResult, app.envelope): in a budgeted run
    the first batch size is not searched either; `every_draft` of that cell and the engine's
    defaults race there instead. `carry` (an envelope's first length's run): its costs go to the
    session's cost profile, which measures again only what changes with the context, and its
    engine model, carried to this length's costs, predicts until a trial here is measured
    (search.enginepredictor)."""
    purpose = Purpose("tune", tuple(layer_skip or ()), batch_sizes[0])
    with open_session(models, purpose) as s:
        settings = s.settings_for(settings, progress)
        if settings.screen_prompts and not s.screens:
            progress.note(f"--screen-prompts: the {s.name} backend measures every prompt of a trial")
        hw = hardware_info(s.device)
        out = out or s.profile_path(hw["slug"], models.target)
        check_writable(out)
        check_replaceable(out, s.content_hash(), settings.force)  # before minutes of measuring
        s.begin(settings, _key(s, models, hw["slug"], settings, batch_sizes[0]))
        costs = None
        if costs_file is not None:
            costs, costs_hw = load_costs(costs_file)
            if not same_hardware(costs_hw, hw):
                raise SpecDecError(
                    f"{costs_file} was measured on {costs_hw.get('slug')}, this is {hw['slug']}"
                )
            s.use_costs(costs)
        elif not no_profile:
            costs = s.costs(
                settings.max_gamma, 5, progress, batch_sizes, carry=carry.costs if carry else None
            )
        # How noisy the machine is (and how fast: the anchors `check` compares), before the search.
        noise, anchors = s.noise_and_anchors()
        settings, line = adapt_to_noise(settings, noise)
        if line:
            progress.note(line)
        # The reference processes `check` will judge against (app.reference) come out of the
        # budget too; on a busy machine there are none (`_reference`).
        reserve_s = 0.0
        if s.fresh_reference and settings.reference_processes and not busy(noise):
            reserve_s = settings.reference_processes * process_seconds(noise.plain_pass_s)
        results: dict[int, Any] = {}
        notes: list[str] = []
        neighbour = s.first_trials(settings.max_gamma)
        # The engine's own defaults race in the final round at the first batch size, so the answer
        # is never below them and the profile shows them beside it (`engine_defaults`).
        defaults = s.default_configs() if settings.finalists else []
        predictor = s.predictor() if costs is not None else None  # an engine's model, fitted from trials
        if predictor is not None and carry is not None and carry.predictor is not None and carry.costs:
            predictor.carry_from(carry.predictor, carry.costs, costs)
        budgeted = budget_s is not None and settings.trials is None and settings.sampler == "tpe"
        case, cut = s.case, ""
        # A budgeted run searches its first batch size; each later one races the first's top
        # configs head to head against plain there (`confirm_candidates`), marked in the profile.
        confirming = budgeted and settings.finalists > 0 and (len(batch_sizes) > 1 or confirm is not None)
        first_from = confirm if confirming else None  # the first batch size confirms another cell's
        first_pinned = (
            union(every_draft(first_from[1], s.specs, settings.max_gamma), defaults)
            if first_from
            else defaults
        )
        # One plain pass at each batch size, measured once: the trial is cut so that the least
        # every batch size does fits, not only the first (a 240 s code-edit run at B = 1,4 in
        # llama.cpp took 511 s when B = 4's passes were first seen after B = 1's search).
        pass_by_b = _pass_times(s, noise.plain_pass_s, batch_sizes) if budgeted else {}
        n, tokens = len(s.case.prompts), max(s.case.max_new_tokens)  # the whole workload's pass

        def cells(k: int, t: int) -> list[Cell]:  # each batch size, a pass cut to k prompts of t tokens
            out = []
            for i, b in enumerate(batch_sizes):
                share = pass_share(s.trial_shape, b, k, n, t, tokens)
                planned = replace(settings, batch_size=b)
                searched = not confirming or (i == 0 and first_from is None)
                pinned = (
                    len(first_pinned)
                    if i == 0
                    else 0
                    if searched
                    else CONFIRM_RACED
                    if first_from
                    else CONFIRM_TOP
                )
                out.append(
                    Cell(planned, pass_by_b[b] * share, s.expected_speedup(costs, planned), pinned, searched)
                )
            return out

        if budgeted and n > 1:
            # A trial is cut to the prompts, then the reply lengths, the least search affords at
            # every batch size before anything else is: a long context or a slow engine must not
            # take the budget 3x over.
            left = budget_s - (time.monotonic() - started) - reserve_s
            k, t = cells_trial_size(cells(n, tokens), left, s.trial_shape, n, tokens)
            if k < n or t < tokens:  # what `check` measures again: the first k prompts, stratified
                picked = stratified(s.workload.prompts, k)
                case = s.case.pick(
                    [next(i for i, p in enumerate(s.workload.prompts) if p is q) for q in picked], t
                )
                cut = (
                    f"each pass measures the first {k} of the {n} prompts"
                    + (f", {t} new tokens each (not {tokens})" if t < tokens else "")
                    + ", the most the least search affords"
                    + (" at every batch size" if len(batch_sizes) > 1 else "")
                )
                progress.note(f"budget: {cut}")
        k_cut, t_cut = len(case.prompts), max(case.max_new_tokens)
        watch = os_snapshot()  # what else the machine does during the search and final round
        for i, b in enumerate(batch_sizes):
            settings_b = replace(settings, batch_size=b)
            if settings.study_name and b != batch_sizes[0]:
                settings_b.study_name = f"{settings.study_name}-b{b}"
            confirming_b = confirming and (i > 0 or first_from is not None)
            candidates = []
            if confirming_b:
                candidates = (
                    first_pinned if i == 0 else later_candidates(results[batch_sizes[0]], bool(first_from))
                )
            if budgeted:
                left = budget_s - (time.monotonic() - started) - reserve_s
                left = (
                    first_cell_share(cells(k_cut, t_cut), left, s.trial_shape)
                    if i == 0
                    else left / (len(batch_sizes) - i)
                )
                pass_s = pass_by_b[b] * pass_share(s.trial_shape, b, k_cut, n, t_cut, tokens)
                expected = s.expected_speedup(costs, settings_b)
                pinned = len(candidates) if confirming_b else len(defaults) if i == 0 else 0
                screen = screen_prompts(settings_b.screen_prompts, len(case.prompts)) if s.screens else 0
                settings_b, note = fit_budget(
                    settings_b, left, pass_s, s.trial_shape, expected, pinned,
                    screen_share=screened_share(screen, len(case.prompts)), searched=not confirming_b,
                )  # fmt: skip
                notes.append(note + (f"; {cut}" if cut and i == 0 else ""))
            if confirming_b:  # its own study: the configs it raced are part of what it answers
                key_b = {
                    **_key(s, models, hw["slug"], settings, b, case),
                    "confirms": [c.label for c in candidates],
                }
                results[b] = run_search(
                    s, s.specs, case, settings_b, None if s.fits_costs_from_trials else costs, study_key=key_b,
                    on_trial=progress.trial, on_final=progress.final, pinned=candidates,
                    predictor=predictor if i == 0 else batched(predictor, b),
                )  # fmt: skip
                results[b].confirmed_from = first_from[0] if i == 0 and first_from else f"B={batch_sizes[0]}"
                _record_flags(s, results[b], b, progress)
                continue
            key_b = _key(s, models, hw["slug"], settings, b, case)
            costs_b = costs
            if s.fits_costs_from_trials:
                # The engine's acceptance comes from the first trials (one per draft); the cost
                # model's best predictions, fed with it, are tried next, then TPE. The cost surface
                # over B is not measured in such an engine: no costs beyond B = 1.
                costs_b = None
                if costs is not None and b == 1:
                    # measured whole (their screens reported, never pruned): each draft's acceptance
                    # and timings fit the model, and later trials' screens are compared with theirs
                    first = replace(
                        settings_b, trials=min(settings_b.trials or 20, 1 + len(s.specs)), finalists=0,
                        screen_prunes=False,
                    )  # fmt: skip
                    probe_started = time.monotonic()
                    probe = run_search(
                        s, s.specs, case, first, study_key=key_b, on_trial=progress.trial,
                        extra_seeds=neighbour, predictor=predictor,
                    )  # fmt: skip
                    costs_b = s.with_trial_acceptance(costs, probe, settings.max_gamma)
                    _enqueue_predictions(probe, s, costs_b, settings_b, predictor)
                    if budgeted:
                        settings_b = after_probe(settings_b, time.monotonic() - probe_started, probe.trials)
            results[b] = run_search(
                s, s.specs, case, settings_b, costs_b, study_key=key_b, on_trial=progress.trial,
                on_final=progress.final, extra_seeds=neighbour, pinned=defaults if i == 0 else None,
                predictor=predictor if i == 0 else batched(predictor, b),
            )  # fmt: skip
            _record_flags(s, results[b], b, progress)
            neighbour = [trial_params(results[b].results[0].config), *s.first_trials(settings.max_gamma)]
        schedule = None
        if len(batch_sizes) > 1 and isinstance(s, Schedules):  # the engine runs its answer as a schedule
            progress.stage("the batch-size schedule, measured against each fixed γ", 0.0)
            schedule = s.batch_schedule(results, case, settings.repeats)
        noise = watched(noise, watch, progress, s.busy_rule)
        first = results[batch_sizes[0]]
        exact = s.exactness(first, case)
        fields = s.engine_fields(first, out.parent, models.target)
        model = s.batch_model(costs)
    if fields.backend.as_dict():  # an engine that describes itself (ours: `backend: {}`)
        fields.backend = replace(
            fields.backend, exactness=exact, cost_model_error=prediction_error(first),
            engine_defaults=default_rows(first, defaults) if defaults else [],
            cost_model=cost_model_fit(first, predictor) if predictor is not None else {},
            schedule=schedule or {},
        )  # fmt: skip
    measured = s.workload  # what was measured: all its prompts, or the first k when the budget cut them
    if len(case.prompts) < len(s.case.prompts):
        measured = replace(s.workload, prompts=stratified(s.workload.prompts, len(case.prompts)))
    workload = replace(workload_info(measured, case), context_length=models.context_length)
    profile = build_profile(
        first, settings, hw, fields, workload=workload, costs=costs, noise=noise, anchors=anchors,
    )  # fmt: skip
    if budget_s is not None and settings.trials is None and settings.sampler == "tpe":
        profile.search.budget_s = budget_s
        profile.search.budget_note = "; ".join(notes)
    if batch_sizes != [1]:
        rows = [batch_row(b, results[b], model, settings.max_gamma) for b in batch_sizes]
        predicted = model.b_star(settings.max_gamma) if model is not None else None
        profile = with_batch_table(profile, rows, predicted)
    profile = s.portable(profile, out, models.target)
    trial_rows = [{**row, "batch_size": b} for b in batch_sizes for row in results[b].rows]
    return SessionRun(
        profile,
        out,
        results,
        trial_rows,
        noise,
        s.fresh_reference,
        s.threads,
        s.prompt_tokens,
        costs,
        predictor,
    )


def _record_flags(s: Any, result: Any, batch_size: int, progress: Progress) -> None:
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


def _pass_times(s: Any, plain_pass_s: float, batch_sizes: list[int]) -> dict[int, float]:
    """Seconds one plain pass over the whole workload takes at each batch size: the noise pass's at
    B = 1, one measured pass (after an untimed one) at any other."""
    return {b: plain_pass_s if b == 1 else s.pass_seconds(b) for b in batch_sizes}


def _key(
    s: Any,
    models: Models,
    hardware_slug: str,
    settings: TuneSettings,
    batch_size: int,
    case: Any = None,
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


def predicted_best(result: Any) -> float | None:
    """The prediction its best config had before it was measured (the tuner's predictor or the
    closed-form model), None when nothing predicted it."""
    predicted = result.results[0].metrics.predicted_speedup
    return round(predicted, 4) if predicted else None


def default_rows(result: Any, defaults: list[Any]) -> list[dict[str, Any]]:
    """The engine's defaults as measured in the final round, each with its speedup, interval and
    the flags that ran it."""
    keys = {c.key for c in defaults}
    rows = []
    for r in result.results:
        if r.config.key in keys:
            m = r.metrics
            rows.append({
                "config": r.config.label, "speedup": round(m.speedup, 4),
                "interval": [round(x, 4) for x in m.speedup_interval or []],
                "tokens_per_s": round(m.tokens_per_s, 3), "acceptance_rate": round(m.acceptance_rate, 4),
                "flags": list(r.backend_args),
            })  # fmt: skip
    return rows


PREDICTED_SEEDS = 4  # the engine model's best configs tried right after the first trials


def _enqueue_predictions(
    result: Any, s: Any, costs: Any, settings: TuneSettings, predictor: Any = None
) -> None:
    """The study's next trials: the engine cost model's best predictions over the whole space
    (fitted from the first trials' decode timings), else the closed-form model's (fed with the
    engine's costs and measured acceptance, and the workload's per-request budgets)."""
    import optuna

    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    ranked = predictor.rank(space_configs(s.specs, settings.max_gamma)) if predictor is not None else []
    if ranked:
        seeds = [trial_params(c) for c, _ in ranked[:PREDICTED_SEEDS]]
    else:
        seeds = seed_configs(s.specs, CostModel(costs, s.case.max_new_tokens), settings)[1:]
    for params in seeds:
        study.enqueue_trial(params, skip_if_exists=True)


def space_configs(specs: list[Any], max_gamma: int) -> list[Config]:
    """Every (draft, gamma) of the space at threshold 0 (a draft of fixed length: its one gamma)."""
    out = []
    for d in specs:
        gammas = [FIXED_GAMMA[d.kind]] if d.kind in FIXED_GAMMA else range(1, max_gamma + 1)
        out += [Config(d, g, 0.0) for g in gammas]
    return out


def cost_model_fit(result: Any, predictor: Any) -> dict[str, Any]:
    """The engine cost model against what was measured: each trial predicted before it ran (out of
    sample), median and worst relative error, and its reason for the best config of each draft."""
    errs = prediction_errors(result)
    best: dict[str, Any] = {}
    for r in result.results:
        if r.config.gamma > 0:
            best.setdefault(r.config.draft.name, r.config)
    out: dict[str, Any] = {"configs": len(errs)}
    if errs:
        out |= {"median_error": round(statistics.median(e for e, _ in errs), 4), "worst_error": round(errs[-1][0], 4),
                "worst_config": errs[-1][1]}  # fmt: skip
    out["reason"] = predictor.explain(result.results[0].config) if result.results[0].config.gamma else ""
    out["per_draft"] = {name: predictor.explain(c) for name, c in best.items()}
    return out


def batched(predictor: Any, batch_size: int) -> Any:
    """The B = 1 engine predictor's view at a later batch size (search.enginepredictor.
    BatchedPredictor), or None where there is none."""
    return BatchedPredictor(predictor, batch_size) if predictor is not None else None
