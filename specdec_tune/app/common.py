"""What the use cases share: the models and workload they load, progress callbacks, the drafter
pool over a session, the costs profile, and the check that an output path is writable."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..domain import Costs, DraftSpec
from ..errors import SpecDecError
from ..measure.noise import busy, during_line, machine_window, noise_line
from ..measure.stats import MIN_PAIRS
from ..search.space import TuneSettings
from ..store.refs import storage_for_record
from ..store.schema import BatchRow, Profile, SearchInfo, WorkloadInfo

if TYPE_CHECKING:  # a name for annotations only: the modes module loads torch
    from ..runtime.caches.modes import EngineMode


@dataclass
class Models:
    """What a measuring use case loads: target, drafts, workload and decoding settings.

    `drafts` are `--draft` strings (a model folder, HF id or demo name, `prompt-lookup[:MIN-MAX]`,
    `layer-skip:K`); None means the demo drafts + prompt lookup for the demo target, prompt lookup
    otherwise. `prompts` takes that many prompts round-robin over the workload's categories.
    """

    target: str | None = None
    drafts: list[str] | None = None
    workload: str = "demo-code"
    prompt: str | None = None
    prompts: int | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    device: str = "auto"
    dtype: str = "auto"
    engine_mode: EngineMode = "auto"  # `--engine`: auto, eager, static or compiled (runtime.caches.modes)
    backend: str = "native"  # where configs are measured: native (our engine) or llamacpp
    llama_server: str | None = None  # the llama-server binary (default: the [llamacpp] extra's)
    threads: int | None = None  # engine threads (default: every core)

    def open(self, lazy_drafts: bool = True, allow_random: bool = False) -> Any:
        """Load the models and the workload; shapes (random weights) only with `allow_random`."""
        from ..runtime.session import open_session

        return open_session(
            self.target,
            self.drafts,
            self.workload,
            self.max_new_tokens,
            self.temperature,
            self.device,
            self.dtype,
            self.prompts,
            self.prompt,
            lazy_drafts=lazy_drafts,
            engine_mode=self.engine_mode,
            allow_random=allow_random,
        )


class Progress:
    """Callbacks a long use case reports through; the CLI draws a progress bar, the default is silent."""

    def stage(self, label: str, fraction: float) -> None:
        """Profiling: `label` starts, `fraction` of the work is done."""

    def trial(self, done: int, total: int, best: float | None) -> None:
        """Search: `done` of `total` trials finished, best speedup so far."""

    def final(self, labels: list[str]) -> None:
        """The final round starts, re-measuring these configs."""

    def note(self, text: str) -> None:
        """Something the user should know that does not stop the work (e.g. a draft skipped)."""


def drafter_pool(s: Any, specs: list[DraftSpec]) -> Any:
    from ..search.tuner import DrafterPool

    return DrafterPool(specs, s.target.model, s.draft_model, s.ctx)


def measure_costs(
    s: Any,
    pool: Any,
    max_gamma: int,
    repeats: int,
    progress: Progress,
    batch_sizes: list[int] | None = None,
    context_len: int | None = None,
) -> Costs:
    """The costs profile of a session's target and drafts; with `batch_sizes` (other than just
    [1]) also the cost surface over them. `context_len` defaults to the workload's typical
    mid-generation length. Acceptance is measured only where both models have trained weights;
    the costs say which weights were random."""
    from ..measure.costs import measure_costs as measure
    from ..runtime.session import has_random_weights

    drafters = {}
    for name in pool.specs:
        try:
            drafters[name] = pool.get(name)
        except Exception as exc:
            progress.note(f"draft '{name}' is unusable, skipped: {exc}")
    # Costs and acceptance need fewer tokens than the search: a subset keeps `profile` quick.
    case = None
    if s.case is not None:
        case = s.case.head(8)
        case.temperature = 0.0
    costs = measure(
        s.target.model,
        drafters,
        case,
        s.device,
        max_gamma=max_gamma,
        repeats=repeats,
        context_len=context_len,
        progress=progress.stage,
        measure_acceptance=[n for n in drafters if acceptance_measured(s, pool.specs[n])],
        ctx=s.ctx,
    )
    costs.engine_mode = s.engine_mode
    costs.weights, costs.shape = s.target.weights, s.target.shape
    for d in costs.drafts:
        if has_random_weights(pool.specs[d.name]):
            d.weights = "random"
    if batch_sizes and batch_sizes != [1]:
        from ..measure.surface import measure_surface

        makers = {name: (lambda b, name=name: pool.get(name, b)) for name in drafters}
        costs.batch, costs.memory_bound_until = measure_surface(
            s.target.model,
            makers,
            batch_sizes,
            costs.context_len,
            max_gamma,
            repeats=max(2, repeats // 2),
            progress=lambda label: progress.stage(label, 0.99),
            case=case,
            ctx=s.ctx,
        )
    costs.compile_fallbacks = list(s.ctx.fallbacks)
    costs.compile = s.ctx.compile_time()  # graph builds so far, never inside a timing
    costs.engine_choice = s.ctx.auto.summary() if s.ctx.auto else None
    return costs


def acceptance_measured(s: Any, spec: DraftSpec) -> bool:
    """Whether the profiler measures this drafter's acceptance: prompts, and trained weights on both sides."""
    from ..runtime.session import has_random_weights

    return s.case is not None and s.target.weights == "trained" and not has_random_weights(spec)


def check_writable(path: Path) -> None:
    """Fail before minutes of measuring, not after, when the output cannot be written."""
    folder = path.parent if str(path.parent) else Path(".")
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if path.is_dir() or not os.access(probe, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecDecError(f"cannot write {path}: choose a writable file path")


@dataclass
class BenchResult:
    target: str
    draft: str
    gamma: int
    threshold: float
    temperature: float
    workload: str
    prompts: int
    device: str
    measurement: Any  # measure.bench.Measurement
    hf: dict[str, Any] | None = None  # transformers' assisted generation, with `compare_hf`
    # per category of the workload (batch 1, two categories or more): acceptance and speedup
    categories: list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("target", "draft", "gamma", "threshold", "temperature")}
        d |= {"workload": self.workload, "prompts": self.prompts, "device": self.device}
        d |= self.measurement.as_dict()
        if self.hf is not None:
            d["hf"] = self.hf
        if self.categories:
            d["categories"] = self.categories
        return d


# The search needs the baseline, a few cost-model seeds and a few TPE trials to mean anything.
MIN_BUDGET_TRIALS = 6
# Plain passes timed before a search to know the machine's noise (each over a share of the prompts).
NOISE_PASSES = 3
MAX_FINAL_REPEATS = 32  # what the noise may raise the final round's racing to


def adapt_to_noise(settings: TuneSettings, noise: Any) -> tuple[TuneSettings, str]:
    """More final-round repeats where the noise needs them (the budget still caps the racing),
    and one line for the user when the noise is above what the planned repeats resolve."""
    line = noise_line(noise, settings.final_max_repeats)
    if noise.repeats_needed > settings.final_repeats and settings.finalists:
        settings = replace(
            settings,
            final_repeats_asked=settings.final_repeats_asked or settings.final_repeats,
            final_repeats=max(settings.final_repeats, MIN_PAIRS + 1),
            final_max_repeats=max(settings.final_max_repeats, min(noise.repeats_needed, MAX_FINAL_REPEATS)),
        )
        if line:
            line += f"; the final round races up to {settings.final_max_repeats} within the budget"
    return settings, line


def watched(noise: Any, snapshot: Any, progress: Progress, rule: Any = None) -> Any:
    """`noise` (domain.Noise) with what the OS said since `snapshot` (measure.noise.os_snapshot,
    taken before the search) as `during_search`; one line for the user when the machine turned
    busy after the noise passes had found it quiet. `rule`: what counts as busy (machine_window)."""
    window = machine_window(snapshot, rule=rule)
    line = during_line(window)
    if line and not busy(noise):
        progress.note(line)
    return replace(noise, during_search=window)


@dataclass
class TuneOutcome:
    profile: Profile
    path: Path  # the profile YAML written
    trials_csv: Path  # one row per trial, beside it
    result: Any  # search.results.TuneResult of the first (smallest) batch size
    by_batch: dict[int, Any] = field(default_factory=dict)  # every batch size's TuneResult


def trial_params(config: Any) -> dict[str, Any]:
    """A config as trial params (what the study enqueues)."""
    if config.gamma == 0:
        return {"draft": "none"}
    params: dict[str, Any] = {"draft": config.draft.name, "gamma": config.gamma}
    if config.draft.has_threshold:
        params["threshold"] = config.threshold
    if config.gamma_policy != "fixed":
        params["gamma_policy"] = config.gamma_policy
    return params


def workload_info(workload: Any, case: Any) -> Any:
    """The profile's workload section (a file workload is stored by path so `check` loads it again)."""
    return WorkloadInfo(
        name=workload.source if not workload.source.startswith("builtin:") else workload.name,
        prompts=len(case.prompts),
        sha256=workload.sha256,
        max_new_tokens=max(case.max_new_tokens),
        temperature=case.temperature,
    )


def search_info(result: Any, settings: Any) -> Any:
    """The profile's search section of a finished search (search.results.TuneResult)."""
    return SearchInfo(
        sampler=settings.sampler,
        trials=result.trials,
        failed=result.failed,
        pruned=result.pruned,
        study_name=result.study_name,
        storage=storage_for_record(result.storage),
        seed=settings.seed,
        space=result.space,
        finalists=result.finalists,
        final_repeats=result.final_repeats if result.finalists else 0,
        final_verdict=result.final_verdict,
        final_margin=list(result.final_margin),
        final_tied=list(result.final_tied),
        outliers=list(result.outliers),
        engine=settings.serving_engine,
    )


def batch_row(batch_size: int, result: Any, model: Any = None, max_gamma: int = 0) -> Any:
    """The batch table row of one batch size's search: its best, each draft's best, and the cost
    model's best prediction there (None without a model)."""
    per_draft: dict[str, Any] = {}
    for r in result.results:  # best first: the first of each draft is its best
        if r.config.gamma > 0:
            per_draft.setdefault(r.config.draft.name, r)
    ranked = model.rank(max_gamma, batch_size=batch_size) if model is not None else []
    predicted = max(1.0, ranked[0][2]) if ranked else None
    return BatchRow(batch_size, result.results[0], list(per_draft.values()), predicted, result.study_name)
