"""The main use case: profile the costs, search at each batch size, and write the winning profile.
One pipeline for every backend: everything engine-specific is asked of its measuring session
(backends.base.MeasuringSession)."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..backends.base import Models, Progress, Purpose, open_session
from ..checkpolicy import CHECK_POLICY
from ..domain import FIXED_GAMMA, Config
from ..errors import SpecDecError
from ..limits import check_count
from ..measure.hardware import hardware_info, same_hardware
from ..measure.noise import busy, os_snapshot
from ..search.budget import after_probe, fit_budget
from ..search.costmodel import CostModel
from ..search.pruning import screen_prompts, screened_share
from ..search.results import prediction_error, prediction_errors
from ..search.space import TuneSettings, seed_configs
from ..store.build import batch_row, build_profile, with_batch_table, workload_info
from ..store.runfiles import check_replaceable, save_run
from ..store.yamlio import load_costs, save_profile
from .common import TuneOutcome, adapt_to_noise, check_writable, trial_params, watched
from .reference import process_seconds, record_reference


def tune(
    models: Models,
    settings: TuneSettings | None = None,
    layer_skip: list[int] | None = None,
    costs_file: Path | None = None,
    no_profile: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
    *,
    batch_sizes: list[int] | None = None,
    budget_s: float | None = None,
) -> TuneOutcome:
    """Profile the costs, search at each batch size, and write the winning profile (default
    `profiles/<hardware>/<target>.yaml`, `<target>.<engine>.yaml` for an engine backend) with the
    trials CSV beside it.

    With `budget_s` and no fixed `settings.trials`, the number of trials is sized from the time
    one plain pass takes on this machine so the whole search, final rounds included, fits the
    budget (search.budget); the profile says what the budget allowed.
    """
    from ..search.tuner import tune as run_search

    started = time.monotonic()
    settings = settings or TuneSettings()
    progress = progress or Progress()
    batch_sizes = sorted(set(batch_sizes or [settings.batch_size]))
    for b in batch_sizes:
        check_count(b, "--batch-sizes")
    if budget_s is not None and not budget_s > 0:
        raise SpecDecError(f"--budget must be > 0 seconds, got {budget_s}")
    if out is not None:
        check_writable(out)
    purpose = Purpose("tune", tuple(layer_skip or ()), batch_sizes[0])
    with open_session(models, purpose) as s:
        settings = s.settings_for(settings, progress)
        if settings.screen_prompts and not s.screens:
            progress.note(f"--screen-prompts: the {s.name} backend measures every prompt of a trial")
        hw = hardware_info(s.device)
        out = out or s.profile_path(hw["slug"], models.target)
        check_writable(out)
        check_replaceable(out, s.content_hash(), settings.force)  # before minutes of measuring
        s.begin(settings, s.study_key(hw["slug"], settings, batch_sizes[0]))
        costs = None
        if costs_file is not None:
            costs, costs_hw = load_costs(costs_file)
            if not same_hardware(costs_hw, hw):
                raise SpecDecError(
                    f"{costs_file} was measured on {costs_hw.get('slug')}, this is {hw['slug']}"
                )
            s.use_costs(costs)
        elif not no_profile:
            costs = s.costs(settings.max_gamma, 5, progress, batch_sizes)
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
        watch = os_snapshot()  # what else the machine does during the search and final round
        for i, b in enumerate(batch_sizes):
            settings_b = replace(settings, batch_size=b)
            if settings.study_name and b != batch_sizes[0]:
                settings_b.study_name = f"{settings.study_name}-b{b}"
            budgeted = budget_s is not None and settings.trials is None and settings.sampler == "tpe"
            if budgeted:
                left = (budget_s - (time.monotonic() - started) - reserve_s) / (len(batch_sizes) - i)
                pass_s = noise.plain_pass_s if b == 1 else s.pass_seconds(b)
                expected = s.expected_speedup(costs, settings_b)
                pinned = len(defaults) if i == 0 else 0
                screen = screen_prompts(settings_b.screen_prompts, len(s.case.prompts)) if s.screens else 0
                settings_b, note = fit_budget(
                    settings_b, left, pass_s, s.trial_shape, expected, pinned,
                    screen_share=screened_share(screen, len(s.case.prompts)),
                )  # fmt: skip
                notes.append(note)
            key_b = s.study_key(hw["slug"], settings, b)
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
                        None, s.specs, s.case, first, study_key=key_b, on_trial=progress.trial,
                        extra_seeds=neighbour, backend=s, predictor=predictor,
                    )  # fmt: skip
                    costs_b = s.with_trial_acceptance(costs, probe, settings.max_gamma)
                    _enqueue_predictions(probe, s, costs_b, settings_b, predictor)
                    if budgeted:
                        settings_b = after_probe(settings_b, time.monotonic() - probe_started, probe.trials)
            results[b] = run_search(
                None, s.specs, s.case, settings_b, costs_b, study_key=key_b, on_trial=progress.trial,
                on_final=progress.final, extra_seeds=neighbour, backend=s, pinned=defaults if i == 0 else None,
                predictor=predictor if i == 0 else None,
            )  # fmt: skip
            for r in results[b].results:
                flags = s.flags(r.config, b)  # the exact flags an engine backend ran (None: ours)
                if flags is not None:
                    r.backend_args = flags
            for n in results[b].lost:
                progress.note(
                    f"trial {n} was failed by another worker while this one was paused; its result is dropped"
                )
            neighbour = [trial_params(results[b].results[0].config), *s.first_trials(settings.max_gamma)]
        noise = watched(noise, watch, progress, s.busy_rule)
        first = results[batch_sizes[0]]
        exact = s.exactness(first)
        fields = s.engine_fields(first, out.parent, models.target)
        model = s.batch_model(costs)
    if fields.backend:
        fields.backend = {**fields.backend, "exactness": exact, "cost_model_error": prediction_error(first)}
        if defaults:
            fields.backend["engine_defaults"] = default_rows(first, defaults)
        if predictor is not None:
            fields.backend["cost_model"] = cost_model_fit(first, predictor)
    profile = build_profile(
        first, settings, hw, fields, workload=workload_info(s.workload, s.case), costs=costs, noise=noise,
        anchors=anchors,
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
    profile, csv_path = save_run(profile, out, trial_rows, settings.force)
    if s.fresh_reference and settings.reference_processes and profile.anchors is not None:
        left = None if budget_s is None else budget_s - (time.monotonic() - started)
        profile = _reference(profile, out, settings.reference_processes, left, noise, progress)
    return TuneOutcome(profile, out, csv_path, first, results)


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


def _reference(
    profile: Any, out: Path, processes: int, left_s: float | None, noise: Any, progress: Any
) -> Any:
    """The tokens/s `check` will judge against, measured in fresh processes (app.reference) and
    stored in the profile's anchors; skipped on a busy machine, whose rates `check` never judges."""
    if busy(noise):
        progress.note("no reference for check's plain tokens/s: the machine was busy during the run")
        return profile
    import torch

    kept, note = record_reference(out, processes, left_s, noise.plain_pass_s, torch.get_num_threads())
    if note:
        progress.note(note)
    least = CHECK_POLICY.min_reference_processes
    if len(kept) < least:
        progress.note(
            f"fewer than {least} quiet reference processes: check judges plain tokens/s "
            "against the final round"
        )
        return profile
    profile.anchors.reference_tokens_per_s = [k["tokens_per_s"] for k in kept]
    profile.anchors.reference_baseline_tokens_per_s = [k["baseline_tokens_per_s"] for k in kept]
    profile.anchors.reference_speedups = [k["speedup"] for k in kept if k.get("speedup")]
    matmul = [k["matmul_gflops"] for k in kept if k.get("matmul_gflops")]
    profile.anchors.reference_matmul_gflops = statistics.median_high(matmul) if matmul else None
    per_anchor = [k["plain_per_anchor"] for k in kept if k.get("plain_per_anchor")]
    if len(per_anchor) >= least:
        profile.anchors.reference_plain_per_anchor = per_anchor
    save_profile(profile, out)
    return profile
