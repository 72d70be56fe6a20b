"""The main use case: profile the costs, search, and write the winning profile."""

from __future__ import annotations

import platform
import statistics
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .. import __version__
from ..checkpolicy import CHECK_POLICY
from ..domain import Anchors, DraftSpec
from ..errors import SpecDecError
from ..limits import check_count
from ..measure.anchors import measure_twice
from ..measure.decode_anchor import spec_of
from ..measure.hardware import hardware_info, same_hardware
from ..measure.llamacpp.args import DEFAULT_DRAFTS
from ..measure.llamacpp.server import servers_die_with_us
from ..measure.noise import busy, measure_noise, os_snapshot
from ..runtime.models.loading import content_hash, slugify
from ..search.costmodel import CostModel
from ..search.space import DEFAULT_TRIALS, TuneSettings
from ..serving.capabilities import restrict
from ..store.refs import make_portable, profile_file_slug
from ..store.runfiles import check_replaceable, save_run
from ..store.schema import Profile, TargetInfo, created_now
from ..store.yamlio import load_costs, save_profile
from .common import (
    MIN_BUDGET_TRIALS,
    NOISE_PASSES,
    Models,
    Progress,
    TuneOutcome,
    adapt_to_noise,
    batch_row,
    check_writable,
    drafter_pool,
    measure_costs,
    search_info,
    trial_params,
    watched,
    workload_info,
)
from .engine import tune_engine
from .engine_plan import server_failures
from .reference import process_seconds, record_reference

# ----------------------------------------------------------------------------------------- tune


def tune(
    models: Models,
    settings: TuneSettings | None = None,
    layer_skip: list[int] | None = None,
    costs_file: Path | None = None,
    no_profile: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
    batch_sizes: list[int] | None = None,
    budget_s: float | None = None,
) -> TuneOutcome:
    """Profile the costs, search at each batch size, and write the winning profile (default
    `profiles/<hardware>/<target>.yaml`) with the trials CSV beside it.

    With `budget_s` and no fixed `settings.trials`, the number of trials is sized from the time
    one plain pass takes on this machine so the whole search, final rounds included, fits the
    budget; the profile says what the budget allowed.
    """
    import time

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
    if models.backend == "llamacpp":
        if costs_file is not None:
            raise SpecDecError("--costs-from holds costs of our own engine; llama.cpp measures its own")
        if layer_skip:
            base = list(models.drafts) if models.drafts is not None else None

            models = replace(
                models, drafts=[*(base or DEFAULT_DRAFTS), *(f"layer-skip:{k}" for k in layer_skip)]
            )
        with servers_die_with_us(), server_failures(models.threads):
            return tune_engine(models, settings, out, progress, batch_sizes, budget_s, no_profile)
    # `auto` is resolved once per study (app.shared_study), not by each worker on its own.
    auto = models.engine_mode == "auto"
    s = (replace(models, engine_mode="eager") if auto else models).open()
    specs = list(s.specs) + [
        DraftSpec(name=f"layer-skip-{k}", kind="layer_skip", layers=k) for k in layer_skip or []
    ]
    if settings.serving_engine is not None:  # `run --for`: what that engine runs, with its policies
        specs, notes = restrict(specs, settings.serving_engine)
        s.specs = [x for x in specs if x.kind != "layer_skip"]  # the drafts the costs profile measures
        for n in notes:
            progress.note(n)
    hw = hardware_info(s.device)

    out = out or Path("profiles") / hw["slug"] / f"{profile_file_slug(s.target.name)}.yaml"
    check_writable(out)
    target_hash = content_hash(s.target.path)
    check_replaceable(out, target_hash, settings.force)  # before minutes of measuring
    key = {
        "specdec_tune": __version__,
        "hardware": hw["slug"],
        "target_slug": slugify(s.target.name),
        "target": target_hash,
        "workload": s.workload.sha256,
        "prompts": len(s.case.prompts),
        "max_new_tokens": s.case.max_new_tokens,
        "temperature": s.case.temperature,
        "dtype": s.target.dtype,
        "repeats": settings.repeats,
        "engine_mode": "auto" if auto else s.engine_mode,
    }
    if auto:
        from .shared_study import settle_auto

        settle_auto(s, specs, settings, key if batch_sizes[0] == 1 else {**key, "batch_size": batch_sizes[0]})
    pool = drafter_pool(s, specs)
    costs = None
    if costs_file is not None:
        costs, costs_hw = load_costs(costs_file)
        if not same_hardware(costs_hw, hw):
            raise SpecDecError(f"{costs_file} was measured on {costs_hw.get('slug')}, this is {hw['slug']}")
    elif not no_profile:
        costs = measure_costs(s, pool, settings.max_gamma, 5, progress, batch_sizes)
    # How noisy the machine is (and how fast: the anchors `check` compares), before the search.
    noise, anchors = _noise_and_anchors(s)
    settings, line = adapt_to_noise(settings, noise)
    if line:
        progress.note(line)
    results: dict[int, Any] = {}
    notes = []
    # The reference processes `check` will judge against (app.reference) come out of the budget
    # too; on a busy machine there are none (`_reference`).
    reserve_s = 0.0
    if settings.reference_processes and not busy(noise):
        reserve_s = settings.reference_processes * process_seconds(noise.plain_pass_s)
    neighbour: list[dict[str, Any]] = []
    watch = os_snapshot()  # what else the machine does during the search and final round
    for i, b in enumerate(batch_sizes):
        settings_b = replace(settings, batch_size=b)
        if settings.study_name and b != batch_sizes[0]:
            settings_b.study_name = f"{settings.study_name}-b{b}"
        if budget_s is not None and settings.trials is None and settings.sampler == "tpe":
            left = budget_s - (time.monotonic() - started) - reserve_s
            pass_s = noise.plain_pass_s if b == 1 else None
            expected = _expected_speedup(costs, s.case, settings_b)
            settings_b, note = _fit_budget(
                s, pool, settings_b, left / (len(batch_sizes) - i), pass_s, expected
            )
            notes.append(note)
        key_b = key if b == 1 else {**key, "batch_size": b}
        results[b] = run_search(
            s.target.model,
            specs,
            s.case,
            settings_b,
            costs,
            pool,
            key_b,
            progress.trial,
            progress.final,
            neighbour,
        )
        for n in results[b].lost:
            progress.note(
                f"trial {n} was failed by another worker while this one was paused; its result is dropped"
            )
        neighbour = [trial_params(results[b].results[0].config)]
    noise = watched(noise, watch, progress)
    first = results[batch_sizes[0]]
    profile = make_profile(first, settings, hw, s.target, s.workload, s.case, costs, s.engine_mode, s.ctx)
    profile.noise, profile.anchors = noise, anchors
    profile.compile = s.ctx.compile_time()  # the whole run's graph builds, apart from the timings
    if budget_s is not None and settings.trials is None and settings.sampler == "tpe":
        profile.search.budget_s = budget_s
        profile.search.budget_note = "; ".join(notes)
    if batch_sizes != [1]:
        model = CostModel(costs, s.case.max_new_tokens) if costs is not None else None
        profile.batch_table = [batch_row(b, results[b], model, settings.max_gamma) for b in batch_sizes]
        losing = [row.batch_size for row in profile.batch_table if row.best.config.gamma == 0]
        profile.b_star = min(losing) if losing else None
        profile.predicted_b_star = model.b_star(settings.max_gamma) if model is not None else None
    # models named so the profile works from any folder and machine (store.refs)
    profile = make_portable(profile, out, models.target or s.target.name)
    rows = [{**row, "batch_size": b} for b in batch_sizes for row in results[b].rows]
    profile, csv_path = save_run(profile, out, rows, settings.force)
    if settings.reference_processes and profile.anchors is not None:
        left = None if budget_s is None else budget_s - (time.monotonic() - started)
        profile = _reference(profile, out, settings.reference_processes, left, noise, progress)
    return TuneOutcome(profile, out, csv_path, first, results)


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


def _noise_and_anchors(s: Any) -> tuple[Any, Any]:
    """Plain passes (batch size 1) timed while watching the OS: the machine's noise, and its
    anchors (plain tokens/s; copy bandwidth and a small matmul rate, measure.anchors). Each pass (and an untimed warm-up) covers
    1/NOISE_PASSES of the prompts, so all cost about 1.3 full passes; `plain_pass_s` is scaled up
    to the whole workload."""
    import dataclasses
    import time

    from ..measure.bench import run_pass

    share = s.case.head(max(1, -(-len(s.case.prompts) // NOISE_PASSES)))
    tokens = []

    def plain_pass() -> float:
        t0 = time.perf_counter()
        out, _ = run_pass(s.target.model, None, 0, 0.0, share, ctx=s.ctx)
        tokens.append(sum(map(len, out)))
        return time.perf_counter() - t0

    # Warm-up on the same prompts, untimed: a static engine captures a graph per new shape there.
    run_pass(s.target.model, None, 0, 0.0, share, ctx=s.ctx)
    # The machine anchors (copy, matmul) before and after the passes, as `check` measures them.
    machine, noise = measure_twice(s.device, lambda: measure_noise(plain_pass, NOISE_PASSES))
    rate = tokens[0] / noise.plain_pass_s
    full_s = noise.plain_pass_s * sum(s.case.max_new_tokens) / max(1, sum(share.max_new_tokens))
    noise = dataclasses.replace(noise, plain_pass_s=round(full_s, 5))
    anchors = Anchors(round(rate, 3), machine.copy_bandwidth_gbps, machine.matmul_gflops)
    anchors.decode_anchor = spec_of(s.target.model)  # its reference: the fresh processes' (_reference)
    return noise, anchors


def _expected_speedup(costs: Any, case: Any, settings: TuneSettings) -> float | None:
    """The cost model's best predicted speedup at `settings.batch_size` (None: no costs there)."""
    if costs is None:
        return None
    ranked = CostModel(costs, case.max_new_tokens).rank(settings.max_gamma, batch_size=settings.batch_size)
    return ranked[0][2] if ranked else None


def _fit_budget(
    s: Any,
    pool: Any,
    settings: TuneSettings,
    budget_s: float,
    pass_s: float | None = None,
    expected_speedup: float | None = None,
) -> tuple[TuneSettings, str]:
    """Trials and a timeout that fit `budget_s` seconds on this machine at `settings.batch_size`.

    One plain pass over the workload is timed (unless `pass_s` says how long it takes). A
    speculative pass takes a plain one divided by its speedup: the finalists' by the cost model's
    best prediction (`expected_speedup`), a search trial's by its square root (the search tries
    configs between plain and the best). A trial is repeats x (its pass + the interleaved plain
    pass); the final round (finalists + baseline) x final_repeats, and as much again for racing.
    The timeout, not the count, is what keeps the search within the budget when trials run
    slower than expected.
    """
    import time

    from ..measure.bench import run_pass
    from ..runtime.batch import batch_generate

    b = settings.batch_size
    if pass_s is None:
        t0 = time.monotonic()
        if b == 1:
            run_pass(s.target.model, None, 0, 0.0, s.case, ctx=s.ctx)
        else:
            batch_generate(s.target.model, None, s.case, b, 0, ctx=s.ctx)
        pass_s = time.monotonic() - t0
    speedup = min(max(expected_speedup or 1.0, 1.0), MAX_EXPECTED_SPEEDUP)
    # The config and the interleaved baseline, each warmed up on one prompt, plus the study's own
    # bookkeeping (sampler, storage writes).
    trial_s = (settings.repeats * (1 + speedup**-0.5) + 2 / len(s.case.prompts)) * pass_s + TRIAL_OVERHEAD_S
    # The final round: at least two finalists and the baseline head to head, then racing rounds
    # for the leading two until resolved (search.racing), which get as much time again.
    # Racing gets what the search's minimum leaves, up to as much again as the first round.
    first_s = (1 + max(2, settings.finalists) / speedup) * settings.final_repeats * pass_s
    search_min_s = MIN_BUDGET_TRIALS * trial_s
    final_s = min(RACE_FACTOR * first_s, max(first_s, budget_s - search_min_s)) if settings.finalists else 0.0
    fits = int((budget_s - final_s) // trial_s) if trial_s > 0 else DEFAULT_TRIALS
    trials = max(MIN_BUDGET_TRIALS, min(DEFAULT_TRIALS, fits))
    timeout = max(budget_s - final_s, search_min_s)
    note = (
        f"B={b}: {max(budget_s, 0.0):.3g} s of the budget left, one plain pass {pass_s:.3g} s"
        + (f", the cost model's best {expected_speedup:.2f}x" if expected_speedup else "")
        + f", so {trials} trials"
        + (f" (fewer than the default {DEFAULT_TRIALS})" if trials < DEFAULT_TRIALS else "")
    )
    least_s = search_min_s + (first_s if settings.finalists else 0.0)
    if least_s > budget_s:  # a slow or busy machine: said, not hidden behind a cut final round
        note += (
            f"; the least a search does ({MIN_BUDGET_TRIALS} trials"
            + (" and the final round's first pass" if settings.finalists else "")
            + f", about {least_s:.0f} s) is more than that, so expect it to run over"
        )
    final_budget = final_s if settings.finalists else None
    return replace(settings, trials=trials, timeout_s=timeout, final_budget_s=final_budget), note


TRIAL_OVERHEAD_S = 0.15
# What a budget plans on at most: a pass never takes less than a quarter of a plain one.
MAX_EXPECTED_SPEEDUP = 4.0
RACE_FACTOR = 2.0


def make_profile(
    result: Any,
    settings: TuneSettings,
    hardware: dict[str, Any],
    target: Any,
    workload: Any,
    case: Any,
    costs: Any,
    engine_mode: str = "eager",
    ctx: Any = None,
) -> Profile:
    """The profile of a finished search (target: runtime.models.LoadedModel, workload: Workload;
    ctx: the session's runtime.caches.modes.ExecutionContext, for compile fallbacks and the auto choice)."""
    versions = {"specdec_tune": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "optuna"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = "unknown"
    return Profile(
        hardware=hardware,
        target=TargetInfo(
            name=target.name,
            path=target.path,
            revision=target.revision,
            content_hash=content_hash(target.path),
            dtype=target.dtype,
            num_params=target.num_params,
        ),
        workload=workload_info(workload, case),
        costs=costs,
        search=search_info(result, settings),
        best=result.results[0],
        # The baseline has its own section; as an alternative it would only take a config's place.
        alternatives=[r for r in result.results[1:] if r.config.gamma > 0][:4],
        baseline=result.baseline,
        engine_mode=engine_mode,
        compile_fallbacks=list(ctx.fallbacks) if ctx is not None else [],
        engine_choice=ctx.auto.summary() if ctx is not None and ctx.auto else None,
        versions=versions,
        created=created_now(),
    )
