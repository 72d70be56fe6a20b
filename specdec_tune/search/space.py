"""What the search may try: its settings, the space of (draft, gamma, threshold), the configs it
tries first (the baseline, then the cost model's best predictions or the whole grid), and how an
Optuna trial turns into a `Config`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..domain import FIXED_GAMMA, GAMMA_POLICIES, NO_DRAFT, Config, DraftSpec
from ..errors import SpecDecError
from ..limits import MAX_BATCH_SIZE, MAX_REPEATS, MAX_TRIALS, check_count, check_gamma, threshold_ok
from ..serving.capabilities import engine_info, gamma_policies_for, tunes_threshold
from .costmodel import CostModel

if TYPE_CHECKING:
    import optuna

THRESHOLD_STEP = 0.05
DEFAULT_TRIALS = 20


@dataclass
class TuneSettings:
    trials: int | None = (
        None  # finished trials the study should hold; None: DEFAULT_TRIALS, or the grid's size
    )
    timeout_s: float | None = None
    sampler: str = "tpe"  # "tpe" or "grid"
    seed: int = 0
    max_gamma: int = 8
    threshold_max: float = 0.95
    grid_thresholds: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6)
    repeats: int = 2
    prune_ratio: float = 0.6  # prune after the first repeat below this share of the best so far
    # Prompts a trial measures first and reports to the pruner (search.pruning); None: a third of
    # the workload's (none below 3 prompts), 0: none. Only a backend that can split a measurement
    # screens (measure.seam.Screen: llama.cpp); the others measure every prompt.
    screen_prompts: int | None = None
    # Whether a screened trial may stop there: the first trials (one per draft, which fit an engine's
    # cost model) report their screen for later trials to be compared with, and go on.
    screen_prunes: bool = True
    seed_top: int = 6  # cost-model predictions enqueued first
    finalists: int = 3  # best configs re-measured head to head after the search (0: none)
    # Interleaved repeats of the final round's first pass: 5, the fewest paired repeats on which the
    # race (measure.stats) can call a winner (a sign test of 5 agreeing pairs: p = 0.0625 <= 0.1),
    # so a clear winner, speculation over plain decoding included, needs no racing round.
    final_repeats: int = 5
    # Racing: more interleaved rounds until the winner is resolved, up to this many repeats of the
    # leader, or until the final round has taken `final_budget_s` seconds (None: no time limit).
    final_max_repeats: int = 16
    final_budget_s: float | None = None
    # `run --final-repeats N`: a hard cap, no finalist gets more than N repeats in the final round.
    # Its first pass is min(N, final_repeats) and neither racing nor the noise (app.common.
    # adapt_to_noise) goes past N: `final_max_repeats` is N. None: racing as above.
    final_repeats_cap: int | None = None
    # What the user asked for before this worker's noise raised it (app.common.adapt_to_noise): the
    # final round's identity in the study, the same for every worker whatever noise each measured.
    final_repeats_asked: int | None = None
    final_floor: float = 0.75  # a finalist's search speedup is at least this share of the best
    storage: str | None = None
    study_name: str | None = None
    serving_engine: str | None = None  # `run --for`: only configs this engine runs (serving/capabilities)
    # A worker writes a heartbeat this often; a trial whose heartbeat is older than the grace
    # period belongs to a dead worker (on any host) and is failed, so the study goes on.
    heartbeat_s: int = 5
    grace_s: int = 20
    batch_size: int = 1  # requests in flight while a trial is measured (closed loop)
    # Per-step gamma policies the search may pick (domain.GAMMA_POLICIES); gamma is their maximum.
    gamma_policies: tuple[str, ...] = ("fixed",)
    # How long a worker waits for another worker's final round before ranking by the search.
    final_wait_s: float = 3600.0
    # `run --force`: replace a profile of another target at the output path (store.runfiles)
    force: bool = False
    # Fresh processes that measure the best config as `check` does after the run (app.reference;
    # 0: none, and `check` judges tokens/s against the final round's; the CLI's default is 3).
    reference_processes: int = 0

    def __post_init__(self) -> None:
        if self.trials is not None:
            check_count(self.trials, "--trials", high=MAX_TRIALS)
        check_gamma(self.max_gamma, allow_zero=False, what="--max-gamma")
        if self.sampler not in ("tpe", "grid"):
            raise SpecDecError(f"unknown sampler '{self.sampler}': use tpe or grid")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise SpecDecError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        check_count(self.repeats, "--repeats", high=MAX_REPEATS)
        if self.screen_prompts is not None:
            check_count(self.screen_prompts, "--screen-prompts", low=0, high=MAX_TRIALS)
        check_count(self.finalists, "--finalists", low=0, high=MAX_TRIALS)
        check_count(self.final_repeats, "--final-repeats", high=MAX_REPEATS)
        check_count(self.reference_processes, "--reference-processes", low=0, high=MAX_REPEATS)
        if self.final_repeats_cap is not None:
            # here, not where the cap is read: every `replace` (the noise, the budget) passes here
            check_count(self.final_repeats_cap, "--final-repeats", high=MAX_REPEATS)
            self.final_repeats = min(self.final_repeats, self.final_repeats_cap)
            self.final_max_repeats = self.final_repeats_cap
        self.final_max_repeats = max(self.final_max_repeats, self.final_repeats)
        if not threshold_ok(self.threshold_max) or not all(map(threshold_ok, self.grid_thresholds)):
            raise SpecDecError("thresholds must be in [0, 1)")
        check_count(self.batch_size, "batch size", high=MAX_BATCH_SIZE)
        self.gamma_policies = tuple(self.gamma_policies)  # a list when read back from JSON
        bad = [p for p in self.gamma_policies if p not in GAMMA_POLICIES]
        if bad or not self.gamma_policies:
            raise SpecDecError(f"unknown gamma policy '{(bad or [''])[0]}': use {', '.join(GAMMA_POLICIES)}")
        if self.serving_engine is not None:
            self.serving_engine = engine_info(self.serving_engine).key
            self.gamma_policies = gamma_policies_for(self.serving_engine, tuple(self.gamma_policies))
        check_count(self.heartbeat_s, "heartbeat interval")
        if self.grace_s <= self.heartbeat_s:
            raise SpecDecError("the heartbeat grace period must be longer than the heartbeat interval")


def trial_count(specs: list[DraftSpec], settings: TuneSettings) -> int:
    """The number of finished trials the search aims for."""
    if settings.trials is not None:
        return settings.trials
    return grid_size(specs, settings) if settings.sampler == "grid" else DEFAULT_TRIALS


def search_space(specs: list[DraftSpec], settings: TuneSettings) -> dict[str, Any]:
    space = {
        "drafts": ["none", *[s.name for s in specs]],
        "gamma": [1, settings.max_gamma],
        "threshold": [0.0, settings.threshold_max, THRESHOLD_STEP],
        "threshold_drafts": [s.name for s in specs if tunes_threshold(s, settings.serving_engine)],
    }
    if settings.serving_engine is not None:  # also keeps a restricted study apart from an unrestricted one
        space["engine"] = settings.serving_engine
    if tuple(settings.gamma_policies) != ("fixed",):  # a fixed-only space stays as it always was
        space["gamma_policies"] = list(settings.gamma_policies)
    return space


def grid_size(specs: list[DraftSpec], settings: TuneSettings) -> int:
    """Trials an exhaustive grid needs: the baseline plus every (draft, gamma, threshold)."""
    return len(seed_configs(specs, None, replace(settings, sampler="grid")))


def seed_configs(
    specs: list[DraftSpec], model: CostModel | None, settings: TuneSettings
) -> list[dict[str, Any]]:
    """What to try first, as trial params: the whole grid, or the baseline plus the cost model's
    top predictions: the best draft at its best gamma and both neighbours, then each other draft
    at its own best (`seed_top` in all)."""
    configs: list[dict[str, Any]] = [{"draft": "none"}]
    if settings.sampler == "grid":
        for s in specs:
            thresholds = settings.grid_thresholds if tunes_threshold(s, settings.serving_engine) else (None,)
            fixed = FIXED_GAMMA.get(s.kind)
            for g in [fixed] if fixed else range(1, settings.max_gamma + 1):
                for t in thresholds:
                    for policy in settings.gamma_policies:
                        c: dict[str, Any] = {"draft": s.name, "gamma": g}
                        if t is not None:
                            c["threshold"] = t
                        if len(settings.gamma_policies) > 1:
                            c["gamma_policy"] = policy
                        configs.append(c)
        return configs
    if model is None:
        return configs
    by_name = {s.name: s for s in specs}
    names = [n for n in model.drafts if n in by_name]
    # The model is least sure where its curve peaks (a few per cent decide between neighbouring
    # gammas), so the draft it predicts best is tried at its best gamma and both neighbours; every
    # other draft at its own best gamma, best predicted first.
    seen: set[str] = set()
    for name, g, _ in model.rank(settings.max_gamma, names, settings.batch_size):
        if name in seen or (seen and len(configs) > settings.seed_top):
            continue
        for n in (g, g - 1, g + 1) if not seen else (g,):
            if 1 <= n <= settings.max_gamma:
                c: dict[str, Any] = {"draft": name, "gamma": n}
                if tunes_threshold(by_name[name], settings.serving_engine):
                    c["threshold"] = 0.0
                if len(settings.gamma_policies) > 1:
                    c["gamma_policy"] = "fixed"
                configs.append(c)
        seen.add(name)
    return configs + _policy_seeds(names, by_name, model, settings)


def _policy_seeds(
    names: list[str], by_name: dict[str, DraftSpec], model: CostModel, settings: TuneSettings
) -> list[dict[str, Any]]:
    """Per adaptive policy, the draft the cost model predicts best with it at gamma max."""
    seeds = []
    for policy in settings.gamma_policies:
        if policy == "fixed":
            continue
        scored = [(model.predict(n, settings.max_gamma, settings.batch_size, policy), n) for n in names]
        scored = [(v, n) for v, n in scored if v is not None and v > 1.0]
        if scored:
            name = max(scored)[1]
            c: dict[str, Any] = {"draft": name, "gamma": settings.max_gamma, "gamma_policy": policy}
            if tunes_threshold(by_name[name], settings.serving_engine):
                c["threshold"] = 0.0
            seeds.append(c)
    return seeds


def suggest(trial: optuna.Trial, specs: dict[str, DraftSpec], space: dict[str, Any]) -> Config:
    """The config an Optuna trial asks for (the threshold only where the draft has a confidence)."""
    draft = trial.suggest_categorical("draft", space["drafts"])
    if draft == "none":
        return Config(NO_DRAFT, 0, 0.0)
    # a draft whose length the engine fixes (ngram-cache) is measured at that length, whatever is asked
    gamma = FIXED_GAMMA.get(specs[draft].kind) or trial.suggest_int("gamma", *space["gamma"])
    threshold = 0.0
    if draft in space.get("threshold_drafts", ()):
        lo, hi, step = space["threshold"]
        threshold = trial.suggest_float("threshold", lo, hi, step=step)
    policy = "fixed"
    if space.get("gamma_policies"):
        policy = trial.suggest_categorical("gamma_policy", space["gamma_policies"])
    return Config(specs[draft], gamma, round(threshold, 4), policy)


def config_of_params(params: dict[str, Any], specs: dict[str, DraftSpec]) -> Config | None:
    """The config a finished trial measured (None when its draft is not in `specs`)."""
    draft = params.get("draft", "none")
    if draft == "none":
        return Config(NO_DRAFT, 0, 0.0)
    if draft not in specs or (params.get("gamma") is None and specs[draft].kind not in FIXED_GAMMA):
        return None
    threshold = params.get("threshold")
    threshold = 0.0 if threshold is None or threshold != threshold else float(threshold)  # NaN: absent
    policy = params.get("gamma_policy")
    policy = policy if isinstance(policy, str) else "fixed"
    gamma = FIXED_GAMMA.get(specs[draft].kind) or int(params["gamma"])
    return Config(specs[draft], gamma, round(threshold, 4), policy)
