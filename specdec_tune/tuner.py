"""The Optuna search over (draft, gamma, threshold) where every trial runs the real speculative loop.

The objective is the speedup measured against the plain target in the same run. The study starts
from the cost model's best predictions (or the whole grid), prunes clearly hopeless trials after
their first repeat, records a failing trial as failed (the study goes on), and lives in an Optuna
storage so a rerun resumes it and several workers can share it. It returns data; it writes no files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .drafters import Drafter, build_drafter
from .errors import SpecDecError
from .measure import Case, Entry, measure, measure_many
from .profile import Config, Costs, DraftSpec, Metrics, Result

NONE = DraftSpec(name="none", kind="none")
THRESHOLD_STEP = 0.05
COUNTED = ("COMPLETE", "PRUNED", "FAIL")


@dataclass
class TuneSettings:
    trials: int = 20
    timeout_s: float | None = None
    sampler: str = "tpe"  # "tpe" or "grid"
    seed: int = 0
    max_gamma: int = 8
    threshold_max: float = 0.95
    grid_thresholds: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6)
    repeats: int = 2
    prune_ratio: float = 0.6  # prune after the first repeat below this share of the best so far
    seed_top: int = 6  # cost-model predictions enqueued first
    finalists: int = 3  # best configs re-measured head to head after the search (0: none)
    final_repeats: int = 4  # interleaved repeats of that final round
    final_floor: float = 0.75  # a finalist's search speedup is at least this share of the best
    storage: str | None = None
    study_name: str | None = None

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise SpecDecError(f"--trials must be >= 1, got {self.trials}")
        if not 1 <= self.max_gamma <= 64:
            raise SpecDecError(f"--max-gamma must be in 1..64, got {self.max_gamma}")
        if self.sampler not in ("tpe", "grid"):
            raise SpecDecError(f"unknown sampler '{self.sampler}': use tpe or grid")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise SpecDecError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.repeats < 1:
            raise SpecDecError(f"--repeats must be >= 1, got {self.repeats}")
        if self.finalists < 0:
            raise SpecDecError(f"--finalists must be >= 0, got {self.finalists}")
        if self.final_repeats < 1:
            raise SpecDecError(f"--final-repeats must be >= 1, got {self.final_repeats}")


@dataclass
class TuneResult:
    results: list[Result]  # completed configs, best first (the baseline included as gamma 0)
    baseline: Metrics
    study_name: str
    storage: str
    trials: int
    failed: int
    pruned: int
    space: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per trial, for the CSV
    finalists: int = 0  # configs the final round re-measured (0: no final round ran)
    final_note: str = ""  # why the final round did not run, when it was asked for and did not


def default_storage() -> str:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec-tune"
    cache.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{cache / 'studies.db'}"


def search_space(specs: list[DraftSpec], settings: TuneSettings) -> dict[str, Any]:
    return {
        "drafts": ["none", *[s.name for s in specs]],
        "gamma": [1, settings.max_gamma],
        "threshold": [0.0, settings.threshold_max, THRESHOLD_STEP],
        "threshold_drafts": [s.name for s in specs if s.kind in ("model", "layer_skip")],
    }


def study_name_for(key: dict[str, Any]) -> str:
    """Same target, workload, budget and space -> same study, so rerunning a command resumes it."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"specdec-{key.get('target_slug', 'target')}-{digest}"


class DrafterPool:
    """Builds drafters on first use; a drafter that fails to build fails its trials, not the run."""

    def __init__(self, specs: list[DraftSpec], target: Any, load: Callable[[DraftSpec], Any] | None = None):
        self.specs = {s.name: s for s in specs}
        self.target = target
        self.load = load  # DraftSpec -> draft model module, for kind "model"
        self._built: dict[str, Drafter | BaseException] = {}

    def preload(self, drafters: dict[str, Drafter]) -> None:
        self._built.update(drafters)

    def get(self, name: str) -> Drafter:
        if name not in self._built:
            try:
                spec = self.specs[name]
                models = {name: self.load(spec)} if spec.kind == "model" and self.load else {}
                self._built[name] = build_drafter(spec, self.target, models)
            except Exception as exc:  # recorded, and re-raised for every trial of this draft
                self._built[name] = exc
        built = self._built[name]
        if isinstance(built, BaseException):
            raise built
        return built


def _predicted(costs: Costs | None, draft: str, gamma: int) -> float | None:
    if costs is None or gamma == 0:
        return 1.0 if gamma == 0 else None
    from .costmodel import overheads, predicted_speedup

    for d in costs.drafts:
        if d.name == draft:
            return predicted_speedup(
                costs.t_target_ms,
                d.t_draft_ms,
                costs.verify_ms,
                d.acceptance_vector,
                gamma,
                **overheads(costs),
            )
    return None


def grid_size(specs: list[DraftSpec], settings: TuneSettings) -> int:
    """Trials an exhaustive grid needs: the baseline plus every (draft, gamma, threshold)."""
    return len(_seed_configs(specs, None, TuneSettings(**{**settings.__dict__, "sampler": "grid"})))


def _seed_configs(
    specs: list[DraftSpec], costs: Costs | None, settings: TuneSettings
) -> list[dict[str, Any]]:
    """What to try first: the whole grid, or the cost model's top predictions plus the baseline."""
    configs: list[dict[str, Any]] = [{"draft": "none"}]
    if settings.sampler == "grid":
        for s in specs:
            thresholds = settings.grid_thresholds if s.kind in ("model", "layer_skip") else (None,)
            for g in range(1, settings.max_gamma + 1):
                for t in thresholds:
                    c = {"draft": s.name, "gamma": g}
                    if t is not None:
                        c["threshold"] = t
                    configs.append(c)
        return configs
    if costs is not None:
        from .costmodel import overheads, rank_configs

        drafts = {
            d.name: (d.t_draft_ms, d.acceptance_vector)
            for d in costs.drafts
            if d.name in {s.name for s in specs}
        }
        kinds = {s.name: s.kind for s in specs}
        ranked = rank_configs(
            costs.t_target_ms, costs.verify_ms, drafts, settings.max_gamma, **overheads(costs)
        )
        seen_per_draft: dict[str, int] = {}
        for name, g, _ in ranked:
            # Spread the seeds over drafts: the model is least sure where it extrapolates.
            if seen_per_draft.get(name, 0) >= max(2, settings.seed_top // max(1, len(drafts))):
                continue
            seen_per_draft[name] = seen_per_draft.get(name, 0) + 1
            c = {"draft": name, "gamma": g}
            if kinds[name] in ("model", "layer_skip"):
                c["threshold"] = 0.0
            configs.append(c)
            if len(configs) > settings.seed_top:
                break
    return configs


def _suggest(trial: Any, specs: dict[str, DraftSpec], space: dict[str, Any]) -> tuple[str, int, float]:
    draft = trial.suggest_categorical("draft", space["drafts"])
    if draft == "none":
        return draft, 0, 0.0
    gamma = trial.suggest_int("gamma", *space["gamma"])
    threshold = 0.0
    if specs[draft].kind in ("model", "layer_skip"):
        lo, hi, step = space["threshold"]
        threshold = trial.suggest_float("threshold", lo, hi, step=step)
    return draft, gamma, round(threshold, 4)


def _counted(study: Any) -> int:
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False):
        failed_here = t.state == TrialState.FAIL and "error" in t.user_attrs
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or failed_here:
            n += 1
    return n


def _running_before(study: Any, number: int) -> int:
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.number < number)


def tune(
    target: Any,
    specs: list[DraftSpec],
    case: Case,
    settings: TuneSettings,
    costs: Costs | None = None,
    pool: DrafterPool | None = None,
    study_key: dict[str, Any] | None = None,
    on_trial: Callable[[int, int, float | None], None] | None = None,
    on_final: Callable[[list[str]], None] | None = None,
) -> TuneResult:
    """Run (or resume) the study until it holds `settings.trials` finished trials; summarise it."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    spec_by_name = {s.name: s for s in specs}
    if "none" in spec_by_name:
        raise SpecDecError("'none' is reserved for the no-speculation baseline; rename that draft")
    space = search_space(specs, settings)
    pool = pool or DrafterPool(specs, target)
    storage_url = settings.storage or default_storage()
    name = settings.study_name or study_name_for(
        {**(study_key or {}), "space": space, "sampler": settings.sampler}
    )
    sampler = (
        optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=4, multivariate=True, group=True)
        if settings.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=settings.seed)
    )
    study = _open_study(name, storage_url, sampler)
    # The study remembers what it measures; a worker with other settings must not mix into it.
    identity = json.loads(json.dumps({"space": space, "key": study_key or {}}, default=str))
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        for params in _seed_configs(specs, costs, settings):
            study.enqueue_trial(params, skip_if_exists=True)
    elif stored != identity:
        keys = {*stored["key"], *identity["key"]}
        diff = sorted(k for k in keys if stored["key"].get(k) != identity["key"].get(k)) or ["search space"]
        raise SpecDecError(
            f"study '{name}' in {_redact(storage_url)} was made with other settings ({', '.join(diff)}); "
            "pass another --study-name or the same settings"
        )

    _fail_orphans(study)
    deadline = time.monotonic() + settings.timeout_s if settings.timeout_s else None
    while _counted(study) < settings.trials:
        if deadline is not None and time.monotonic() > deadline:
            break
        trial = study.ask()
        trial.set_user_attr("worker", _WORKER)
        if _counted(study) + _running_before(study, trial.number) >= settings.trials:
            # Another worker took the last slot between our count and our ask.
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=TrialState.FAIL)
            break
        _run_trial(study, trial, pool, spec_by_name, space, case, costs, settings)
        if on_trial is not None:
            on_trial(_counted(study), settings.trials, _best_value(study))
    result = summarise(study, specs, costs, name, storage_url, space)
    if settings.finalists > 0:
        final_round(study, result, pool, case, settings, on_final)
    return result


def pick_finalists(results: list[Result], k: int, floor: float = 0.75) -> list[Result]:
    """The configs worth re-measuring: the best of each draft first, then the next best overall.

    `results` is best first by search speedup. One best per draft comes first so that a single
    lucky trial of one draft cannot crowd out the others; a config below `floor` × the best
    search speedup is not a contender.
    """
    contenders = [r for r in results if r.config.gamma > 0]
    if not contenders or k <= 0:
        return []
    cut = floor * max(r.metrics.speedup for r in contenders)
    contenders = [r for r in contenders if r.metrics.speedup >= cut]
    chosen: list[Result] = []
    for r in contenders:
        if len(chosen) < k and all(c.config.draft.name != r.config.draft.name for c in chosen):
            chosen.append(r)
    for r in contenders:
        if len(chosen) < k and all(c is not r for c in chosen):
            chosen.append(r)
    return sorted(chosen, key=lambda r: -r.metrics.speedup)


def final_round(
    study: Any,
    result: TuneResult,
    pool: DrafterPool,
    case: Case,
    settings: TuneSettings,
    on_start: Callable[[list[str]], None] | None = None,
) -> None:
    """Re-measure the finalists and the baseline in one interleaved run; the winner comes from it.

    Each search trial is one short noisy measurement, and the highest of many noisy values is
    biased upwards (the winner's curse): a config can top the search on one lucky trial. The
    finalists get fresh measurements timed side by side, which are unbiased and directly
    comparable. The round is stored in the study, so rerunning a finished study reuses it.
    Updates `result` in place: finalists and baseline first (by final speedup), then the rest.
    """
    finalists = pick_finalists(result.results, settings.finalists, settings.final_floor)
    if not finalists:
        return
    key = {
        "trials": result.trials,
        "configs": [list(_config_key(r.config)) for r in finalists],  # JSON-shaped, as stored
        "repeats": settings.final_repeats,
    }
    stored = study.user_attrs.get("final_round")
    if isinstance(stored, dict) and stored.get("key") == key:
        measured = [_metrics_from_attrs(m) for m in stored["metrics"]]
    else:
        if on_start is not None:
            on_start([r.config.label for r in finalists])
        try:
            entries = [
                Entry(pool.get(r.config.draft.name), r.config.gamma, r.config.threshold) for r in finalists
            ]
            ms = measure_many(pool.target, entries, case, settings.final_repeats, seed=settings.seed)
        except Exception as exc:  # e.g. a draft that no longer loads: keep the search's ranking
            result.final_note = f"final round skipped: {type(exc).__name__}: {exc}"[:300]
            _free_device_memory()
            return
        measured = []
        for r, m in zip(finalists, ms, strict=True):
            metrics = m.to_metrics(r.metrics.predicted_speedup)
            metrics.search_speedup = r.metrics.speedup
            measured.append(metrics)
        study.set_user_attr("final_round", {"key": key, "metrics": [vars(m) for m in measured]})
    final = [Result(r.config, m) for r, m in zip(finalists, measured, strict=True)]
    base = [r for r in result.results if r.config.gamma == 0]
    head = sorted(final + base, key=lambda r: -r.metrics.speedup)
    picked = {_config_key(r.config) for r in final}
    rest = [r for r in result.results if r.config.gamma > 0 and _config_key(r.config) not in picked]
    result.results = head + rest
    result.finalists = len(final)
    for r in final:
        m = r.metrics
        result.rows.append(
            _csv_row(
                None, "FINAL", r.config.draft.name, r.config.gamma, r.config.threshold, m.speedup, vars(m)
            )
        )


_CSV_ATTRS = (
    "tokens_per_s",
    "baseline_tokens_per_s",
    "acceptance_rate",
    "mean_accepted_len",
    "predicted_speedup",
    "duration_s",
    "error",
)


def _csv_row(
    number: int | None,
    state: str,
    draft: str,
    gamma: int,
    threshold: float,
    speedup: float | None,
    attrs: dict,
) -> dict[str, Any]:
    """One row of the trials CSV, for a search trial (attrs: its user attrs) or a finalist (its metrics)."""
    head = {"number": number, "state": state, "draft": draft, "gamma": gamma, "threshold": threshold}
    return {**head, "speedup": speedup, **{k: attrs.get(k) for k in _CSV_ATTRS}}


def _config_key(c: Config) -> tuple[str, int, float]:
    return (c.draft.name, c.gamma, round(c.threshold, 4))


def _metrics_from_attrs(d: dict[str, Any]) -> Metrics:
    known = set(Metrics.__dataclass_fields__)
    return Metrics(**{k: v for k, v in d.items() if k in known})


_WORKER = f"{socket.gethostname()}:{os.getpid()}"


def _fail_orphans(study: Any) -> None:
    """Trials left RUNNING by a killed process on this host are marked interrupted (not counted)."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        name, _, pid = worker.rpartition(":")
        if name == host and pid.isdigit() and not _alive(int(pid)):
            study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_study(name: str, storage_url: str, sampler: Any) -> Any:
    """Create or load the study; retried because workers starting together race on a new database."""
    import optuna

    last: Exception | None = None
    for attempt in range(5):
        try:
            storage: Any = storage_url
            if storage_url.startswith("sqlite"):
                # Wait for another process's write lock instead of failing at once.
                storage = optuna.storages.RDBStorage(
                    storage_url, engine_kwargs={"connect_args": {"timeout": 60}}
                )
            return optuna.create_study(
                study_name=name, storage=storage, sampler=sampler, direction="maximize", load_if_exists=True
            )
        except (ImportError, ValueError) as exc:
            last = exc
            break
        except Exception as exc:  # sqlalchemy: a schema race, a bad URL, an unreachable server
            last = exc
            time.sleep(0.2 * (attempt + 1))
    first = str(last).splitlines()[0] if str(last) else ""
    raise SpecDecError(
        f"cannot open Optuna storage '{_redact(storage_url)}': {type(last).__name__}: {first}"
    ) from None


def _best_value(study: Any) -> float | None:
    try:
        return study.best_value
    except ValueError:
        return None


def _run_trial(study, trial, pool, specs, space, case, costs, settings) -> None:
    import optuna
    from optuna.trial import TrialState

    best = _best_value(study)

    def on_repeat(r: int, speedup: float) -> None:
        trial.report(speedup, r)
        # Conservative: only a config far below the best so far is dropped, so noise cannot
        # prune the eventual winner.
        if r == 0 and settings.repeats > 1 and best is not None and speedup < settings.prune_ratio * best:
            raise optuna.TrialPruned()

    started = time.monotonic()
    try:
        draft, gamma, threshold = _suggest(trial, specs, space)
        if draft == "none" and _reuse_baseline(study, trial):
            return
        drafter = None if draft == "none" else pool.get(draft)
        m = measure(
            pool.target,
            drafter,
            gamma,
            threshold,
            case,
            settings.repeats,
            seed=settings.seed,
            on_repeat=on_repeat,
        )
        if not math.isfinite(m.speedup):
            raise RuntimeError("measured speedup is not finite")
        attrs = {
            "tokens_per_s": m.tokens_per_s,
            "baseline_tokens_per_s": m.baseline_tokens_per_s,
            "speedup_spread": m.speedup_spread,
            "acceptance_rate": m.acceptance_rate,
            "mean_accepted_len": m.mean_accepted_len,
            "per_position_acceptance": m.per_position_acceptance,
            "repeats": m.repeats,
            "mismatches": m.mismatches,
            "predicted_speedup": _predicted(costs, draft, gamma),
            "duration_s": time.monotonic() - started,
        }
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, m.speedup)
    except optuna.TrialPruned:
        trial.set_user_attr("duration_s", time.monotonic() - started)
        study.tell(trial, state=TrialState.PRUNED)
    except KeyboardInterrupt:
        trial.set_user_attr("interrupted", True)
        study.tell(trial, state=TrialState.FAIL)
        raise
    except Exception as exc:  # CUDA OOM, a draft that fails to load, ...: this trial fails alone
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:500])
        study.tell(trial, state=TrialState.FAIL)
        _free_device_memory()


def _reuse_baseline(study: Any, trial: Any) -> bool:
    """The sampler asked for the baseline again: its speedup is 1.0 by definition, so the finished
    baseline trial's numbers are copied instead of spending a measurement on it."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.params.get("draft") == "none" and not t.user_attrs.get("reused_baseline"):
            for k, v in t.user_attrs.items():
                if k != "worker":
                    trial.set_user_attr(k, v)
            trial.set_user_attr("reused_baseline", True)
            trial.set_user_attr("duration_s", 0.0)
            study.tell(trial, 1.0)
            return True
    return False


def _free_device_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


def summarise(
    study: Any, specs: list[DraftSpec], costs: Costs | None, name: str, storage: str, space: dict
) -> TuneResult:
    """Completed trials -> Results (best first, one per distinct config), baseline, trial rows."""
    from optuna.trial import TrialState

    spec_by_name = {"none": NONE, **{s.name: s for s in specs}}
    rows: list[dict[str, Any]] = []
    results: list[Result] = []
    failed = pruned = 0
    base_rates = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        if ua.get("surplus") or t.state == TrialState.RUNNING or t.state == TrialState.WAITING:
            continue
        draft = t.params.get("draft", "none")
        gamma = int(t.params.get("gamma", 0)) if draft != "none" else 0
        threshold = round(float(t.params.get("threshold", 0.0)), 4)
        speedup = t.value if t.state == TrialState.COMPLETE else None
        rows.append(_csv_row(t.number, t.state.name, draft, gamma, threshold, speedup, ua))
        if t.state == TrialState.FAIL:
            failed += "error" in ua
        elif t.state == TrialState.PRUNED:
            pruned += 1
        elif t.state == TrialState.COMPLETE and not ua.get("reused_baseline"):
            base_rates.append(ua["baseline_tokens_per_s"])
    # A config the sampler tried more than once is judged by its median trial, not its luckiest:
    # picking the maximum of noisy repeats would overstate the winner.
    groups: dict[tuple[str, int, float], list[Any]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        draft = t.params.get("draft", "none")
        if draft not in spec_by_name:
            continue
        gamma = int(t.params.get("gamma", 0)) if draft != "none" else 0
        threshold = round(float(t.params.get("threshold", 0.0)), 4) if draft != "none" else 0.0
        groups.setdefault((draft, gamma, threshold), []).append(t)
    for (draft, gamma, threshold), trials in groups.items():
        trials.sort(key=lambda t: t.value)
        t = trials[(len(trials) - 1) // 2]
        ua = t.user_attrs
        metrics = Metrics(
            tokens_per_s=ua["tokens_per_s"],
            baseline_tokens_per_s=ua["baseline_tokens_per_s"],
            speedup=1.0 if draft == "none" else t.value,
            speedup_spread=ua.get("speedup_spread", 0.0),
            acceptance_rate=ua.get("acceptance_rate", 0.0),
            mean_accepted_len=ua.get("mean_accepted_len", 1.0),
            per_position_acceptance=list(ua.get("per_position_acceptance") or []),
            repeats=int(ua.get("repeats", 1)),
            predicted_speedup=ua.get("predicted_speedup"),
        )
        results.append(Result(Config(spec_by_name[draft], gamma, threshold), metrics))
    results.sort(key=lambda r: -r.metrics.speedup)
    if not results:
        reasons = sorted({r["error"] for r in rows if r.get("error")})
        raise SpecDecError(
            "no trial finished, so there is no profile to write"
            + (f"; trials failed with: {'; '.join(reasons[:3])}" if reasons else "")
        )
    base_rate = statistics.median(base_rates)
    baseline = Metrics(base_rate, base_rate, 1.0, 0.0, 0.0, 1.0, [], results[0].metrics.repeats, 1.0)
    return TuneResult(
        results=results,
        baseline=baseline,
        study_name=name,
        storage=storage,
        trials=len([r for r in rows if r["state"] != "FAIL" or r.get("error")]),
        failed=failed,
        pruned=pruned,
        space=space,
        rows=rows,
    )


def make_profile(
    result: TuneResult,
    settings: TuneSettings,
    hardware: dict[str, Any],
    target: Any,
    workload: Any,
    case: Case,
    costs: Costs | None,
) -> Any:
    """The YAML profile for a finished search (target: models.LoadedModel, workload: Workload)."""
    import datetime
    import platform

    from . import __version__
    from .models import content_hash
    from .profile import Profile, SearchInfo, TargetInfo, WorkloadInfo

    versions = {"specdec_tune": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "optuna"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:
            versions[pkg] = "unknown"
    budgets = sorted(set(case.max_new_tokens))
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
        workload=WorkloadInfo(
            # A file workload is stored by path so `check` can load it again.
            name=workload.source if not workload.source.startswith("builtin:") else workload.name,
            prompts=len(case.prompts),
            sha256=workload.sha256,
            max_new_tokens=budgets[-1],
            temperature=case.temperature,
        ),
        costs=costs,
        search=SearchInfo(
            sampler=settings.sampler,
            trials=result.trials,
            failed=result.failed,
            pruned=result.pruned,
            study_name=result.study_name,
            storage=_redact(result.storage),
            seed=settings.seed,
            space=result.space,
            finalists=result.finalists,
            final_repeats=settings.final_repeats if result.finalists else 0,
        ),
        best=result.results[0],
        # The baseline has its own section; as an alternative it would only take a config's place.
        alternatives=[r for r in result.results[1:] if r.config.gamma > 0][:4],
        baseline=result.baseline,
        versions=versions,
        created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
    )


def _redact(url: str) -> str:
    """Never write a database password into a profile."""
    import re

    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)
