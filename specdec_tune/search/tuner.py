"""The Optuna search over (draft, gamma, threshold) where every trial runs the real speculative loop.

The objective is the speedup measured against the plain target in the same run. The study starts
from the baseline and the cost model's best predictions (or the whole grid), prunes clearly
hopeless trials after their first repeat, records a failing trial as failed (the study goes on),
and lives in an Optuna storage so a rerun resumes it and several workers can share it. Each
trial runs through `study.optimize`, so Optuna's heartbeat watches it. It returns data; it
writes no files.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..domain import Config, Costs, DraftSpec
from ..errors import SpecDecError
from ..measure.seam import Case, MeasuringBackend, Screen
from ..measure.stats import speedup_interval
from .costmodel import CostModel
from .final import final_round
from .pruning import make_pruner, screen_prompts
from .results import TuneResult, summarise
from .space import TuneSettings, search_space, seed_configs, suggest, trial_count
from .storage import StorageLock
from .study import (
    INTERRUPTED,
    SURPLUS,
    WORKER,
    best_value,
    claim_identity,
    counted,
    default_storage,
    fail_interrupted,
    fail_stale,
    open_study,
    redact,
    running,
    slot_counts,
    study_name_for,
)

if TYPE_CHECKING:
    import optuna

    from .enginepredictor import Predictor

POLL_S = 1.0  # how often a worker looks again while others hold the study's last slots


def tune(
    backend: MeasuringBackend,
    specs: list[DraftSpec],
    case: Case,
    settings: TuneSettings,
    costs: Costs | None = None,
    study_key: dict[str, Any] | None = None,
    on_trial: Callable[[int, int, float | None], None] | None = None,
    on_final: Callable[[list[str]], None] | None = None,
    extra_seeds: list[dict[str, Any]] | None = None,
    pinned: list[Config] | None = None,
    predictor: Predictor | None = None,
) -> TuneResult:
    """Run (or resume) the study until it holds `settings.trials` finished trials; summarise it.

    Every trial and the final round measure through `backend` (a measuring session, backends; the
    caller opens it, so the search never knows which engine measures). `costs` feed the
    closed-form cost model's predictions and seeds.
    `extra_seeds` (trial params, e.g. the neighbouring batch size's winner) are tried right after
    the cost model's seeds when the study is new; `pinned` configs (an engine's defaults) race in
    the final round whatever the search found (search.final). `predictor` (an engine's cost model
    fitted from the trials, backends) predicts each trial before it is measured, in place of the
    closed-form model, and observes its measurement after (`predict(config)`, `observe(config, m)`).
    """
    by_name = {s.name: s for s in specs}
    if "none" in by_name:
        raise SpecDecError("'none' is reserved for the no-speculation baseline; rename that draft")
    space = search_space(specs, settings)
    # The workload's budgets: the prediction counts the cut near each request's end.
    model = CostModel(costs, case.max_new_tokens) if costs is not None else None
    storage_url = settings.storage or default_storage()
    name = study_name(specs, settings, study_key)
    study = _open(name, storage_url, settings)
    identity = {"space": space, "key": study_key or {}}
    seeds = seed_configs(specs, model, settings)
    seeds += [p for p in extra_seeds or [] if p not in seeds and p.get("draft") in space["drafts"]]
    claim_identity(study, identity, seeds, redact(storage_url))

    total = trial_count(specs, settings)
    objective = _Objective(study, backend, by_name, space, case, model, settings, total)
    objective.predictor = predictor
    lost = _trials(study, objective, storage_url, name, settings, total, on_trial)
    result = summarise(study, specs, name, storage_url, space)
    result.lost = lost
    if settings.finalists > 0:
        claim = StorageLock(storage_url, f"{name}:final")
        try:
            final_round(
                study,
                result,
                backend,
                case,
                settings,
                on_final,
                claim,
                _ceiling(model, settings),
                pinned=pinned,
            )
        finally:
            claim.close()
        _predict_unpredicted(result, model, predictor, settings.batch_size)
    return result


def _open(name: str, storage_url: str, settings: TuneSettings) -> optuna.Study:
    """The study `name` in `storage_url` (created or resumed) with the settings' sampler, the
    pruner and the heartbeat; Optuna's own logging and warnings quieted."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("optuna").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage")
    sampler = (
        optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=4, multivariate=True, group=True)
        if settings.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=settings.seed)
    )
    return open_study(name, storage_url, sampler, settings.heartbeat_s, settings.grace_s, make_pruner())


def _trials(
    study: optuna.Study,
    objective: _Objective,
    storage_url: str,
    name: str,
    settings: TuneSettings,
    total: int,
    on_trial: Callable[[int, int, float | None], None] | None,
) -> list[int]:
    """Run trials until the study holds `total` finished ones (or the timeout); returns the numbers
    of the trials this worker lost to a peer while it was paused.

    Counting the free slots and creating the trial happen under one lock shared by all workers, so
    two workers never take the last slot together; the trial releases it once it exists."""
    deadline = time.monotonic() + settings.timeout_s if settings.timeout_s else None
    slots = StorageLock(storage_url, f"{name}:trials")
    lost: list[int] = []
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                break
            # A holder that hangs without dying must not stall the others for ever.
            slots.acquire(timeout_s=3 * settings.grace_s)
            try:
                done, busy = slot_counts(study)
                if done >= total:
                    break
                if done + busy >= total:
                    # Other workers hold the last slots: wait for them, or for their heartbeat to
                    # go stale.
                    slots.release()
                    fail_stale(study)
                    time.sleep(POLL_S)
                    continue
                _one_trial(study, objective, storage_url, slots, lost)
            finally:
                slots.release()
            if on_trial is not None:
                on_trial(counted(study), total, best_value(study))
    finally:
        slots.close()
    return lost


def _one_trial(
    study: optuna.Study, objective: _Objective, storage_url: str, slots: StorageLock, lost: list[int]
) -> None:
    """One trial, the slot lock released once it exists. Paused past the grace period (SIGSTOP, a
    long lock wait), this worker had its trial failed by a peer: recording its result raises. The
    trial is lost (added to `lost`, not counted, another takes its place); anything else is a real
    error. Ctrl-C fails the trial it interrupted."""
    objective.on_start, objective.number = slots.release, None
    first_new = len(study.get_trials(deepcopy=False))  # the number the next trial gets
    try:
        study.optimize(objective, n_trials=1, catch=(Exception,))
    except KeyboardInterrupt:
        fail_interrupted(study, storage_url, objective.number, first_new)
        raise
    except Exception:
        number = objective.number
        if number is None or not _lost_to_peer(study, number):
            raise
        lost.append(number)


def _predict_unpredicted(
    result: TuneResult, model: CostModel | None, predictor: Predictor | None, batch_size: int
) -> None:
    """A finalist no trial measured (a pinned default, a config raced from another cell) gets the
    prediction a trial of it would have had: the engine's fitted model or the closed-form one. The
    final round is never fed to either, so it stays out of sample."""
    for r in result.results:
        if r.config.gamma > 0 and r.metrics.predicted_speedup is None:
            r.metrics.predicted_speedup = predict_config(r.config, model, predictor, batch_size)


def predict_config(
    config: Config, model: CostModel | None, predictor: Predictor | None, batch_size: int
) -> float | None:
    """`config`'s predicted speedup at `batch_size`: the engine's model fitted from the trials
    (`predictor`) where there is one, else the closed-form model over the costs, else None."""
    if predictor is not None:
        return predictor.predict(config)
    if model is not None:
        return model.predict(config.draft.name, config.gamma, batch_size, config.gamma_policy)
    return None


def study_name(specs: list[DraftSpec], settings: TuneSettings, study_key: dict[str, Any] | None) -> str:
    """The study `tune` opens for these drafts, settings and key (`settings.study_name` if set)."""
    space = search_space(specs, settings)
    key = {**(study_key or {}), "space": space, "sampler": settings.sampler}
    return settings.study_name or study_name_for(key)


def _lost_to_peer(study: optuna.Study, number: int) -> bool:
    """Whether trial `number` (this worker's) was finished by another worker: failed by its
    heartbeat check while this one was paused."""
    from optuna.trial import TrialState

    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    return trial is not None and trial.state != TrialState.RUNNING


def _note(trial: optuna.Trial, key: str, value: object) -> None:
    """`trial.set_user_attr` where failing must not hide the error being handled: a trial that a
    peer already finished takes no more attributes."""
    import optuna

    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        trial.set_user_attr(key, value)


def _ceiling(model: CostModel | None, settings: TuneSettings) -> Callable[[Any], float | None] | None:
    """The cost model's most a config can reach here (every draft token accepted), if it knows."""
    if model is None:
        return None
    return lambda c: model.ceiling(c.draft.name, c.gamma, settings.batch_size, c.gamma_policy)


class _Objective:
    """One trial: ask the config, measure it against the baseline, record its metrics as user
    attributes (readable by optuna-dashboard and `optuna.load_study`)."""

    def __init__(self, study, backend, specs, space, case, model, settings, total) -> None:
        self.study, self.backend, self.specs, self.space = study, backend, specs, space
        self.case, self.model, self.settings, self.total = case, model, settings, total
        self.on_start: Callable[[], None] = lambda: None
        self.number: int | None = None  # the trial this worker runs now
        self.predictor: Predictor | None = None  # an engine cost model fitted as trials come in

    def __call__(self, trial: optuna.Trial) -> float:
        import optuna

        self.number = trial.number
        self.on_start()
        started = time.monotonic()
        trial.set_user_attr("worker", WORKER)
        try:
            if counted(self.study) + running(self.study, before=trial.number) >= self.total:
                # Only without a storage lock: this trial lost the race for the last slot. Pruned,
                # not failed, and not counted; it is no failure.
                trial.set_user_attr(SURPLUS, True)
                raise optuna.TrialPruned()
            config = suggest(trial, self.specs, self.space)
            if config.gamma == 0 and self._reuse_baseline(trial):
                return 1.0
            best = best_value(self.study)
            prune_below = self.settings.prune_ratio * best if best is not None else None

            screened = False  # a screen reports at the step of its prompts instead (on_screen)

            def on_repeat(r: int, speedup: float) -> None:
                if not screened:
                    trial.report(speedup, r)
                # Conservative: only a config far below the best so far is dropped, so noise
                # cannot prune the eventual winner.
                if r == 0 and self.settings.repeats > 1 and prune_below and speedup < prune_below:
                    raise optuna.TrialPruned()

            def on_screen(prompts: int, speedup: float) -> None:
                # the first prompts' speedup, against the others' on the same prompts (search.pruning)
                trial.report(speedup, prompts)
                trial.set_user_attr("screen", {"prompts": prompts, "speedup": round(speedup, 5)})
                if self.settings.screen_prunes and trial.should_prune():
                    raise optuna.TrialPruned()

            # predicted before it is measured: the profile's prediction error is out of sample
            predicted = predict_config(config, self.model, self.predictor, self.settings.batch_size)
            extra = {}
            first = screen_prompts(self.settings.screen_prompts, len(self.case.prompts))
            if first and self.backend.screens:
                extra["screen"], screened = Screen(first, on_screen), True
            (m,) = self.backend.measure(
                [config],
                self.case,
                self.settings.batch_size,
                self.settings.repeats,
                seed=self.settings.seed,
                on_repeat=on_repeat,
                **extra,
            )
            if not math.isfinite(m.metrics.speedup):
                raise RuntimeError("measured speedup is not finite")
            if self.predictor is not None:
                self.predictor.observe(config, m)
            m.metrics.predicted_speedup = predicted
            samples = list(m.speedups)
            m.metrics.speedup_samples = [round(x, 5) for x in samples]
            m.metrics.speedup_interval = speedup_interval(samples, self.settings.seed)
            for k, v in {**m.metrics.as_dict(), "mismatches": m.mismatches}.items():
                trial.set_user_attr(k, v)
            if m.flags:  # what an engine backend ran and how exact it was
                trial.set_user_attr("flags", m.flags)
            if m.exactness:
                trial.set_user_attr("exactness", m.exactness)
            return m.metrics.speedup
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt:
            _note(trial, INTERRUPTED, True)
            raise
        except Exception as exc:  # CUDA OOM, a draft that fails to load, ...: this trial fails alone
            # At B > 1 an out-of-memory names the batch size: the cure is usually a smaller one.
            where = f"at batch size {self.settings.batch_size}: " if self.settings.batch_size > 1 else ""
            _note(trial, "error", f"{where}{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            _note(trial, "duration_s", time.monotonic() - started)

    def _reuse_baseline(self, trial: optuna.Trial) -> bool:
        """The sampler asked for the baseline again: its speedup is 1.0 by definition, so the
        finished baseline trial's numbers are copied instead of spending a measurement on it."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.params.get("draft") == "none" and not t.user_attrs.get("reused_baseline"):
                for k, v in t.user_attrs.items():
                    if k not in ("worker", "duration_s"):
                        trial.set_user_attr(k, v)
                trial.set_user_attr("reused_baseline", True)
                return True
        return False
