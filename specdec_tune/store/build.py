"""A finished search as the profile's sections: the workload, the search, the batch table rows and
the profile itself. One builder for every backend: what an engine adds (its target, versions, mode,
build and exactness) comes in as `EngineFields` from its measuring session (`backends`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol

from ..domain import Anchors, CompileTime, Costs, Noise, Result
from .refs import storage_for_record
from .schema import (
    BackendInfo,
    BatchRow,
    ContextRow,
    EnvelopeLine,
    Profile,
    SearchInfo,
    TargetInfo,
    WorkloadInfo,
    created_now,
)

if TYPE_CHECKING:
    from ..search.costmodel import CostModel
    from ..search.results import TuneResult
    from ..search.space import TuneSettings


@dataclass
class EngineFields:
    """What the engine that measured puts in a profile beside the search's results."""

    target: TargetInfo
    versions: dict[str, str]
    engine_mode: str = "eager"
    compile_fallbacks: list[str] = field(default_factory=list)
    engine_choice: str | None = None
    backend: BackendInfo = field(default_factory=BackendInfo)
    compile: CompileTime | None = None


class _Workload(Protocol):
    """What the profile keeps of a workload (runtime.workloads.Workload is one): store imports no
    stage, so it names the shape it reads."""

    name: str
    source: str
    sha256: str


class _Case(Protocol):
    """What the profile keeps of a pass (a session's case)."""

    prompts: Sequence[object]
    max_new_tokens: Sequence[int]
    temperature: float


def workload_info(workload: _Workload, case: _Case) -> WorkloadInfo:
    """The profile's workload section (a file workload is stored by path so `check` loads it again)."""
    return WorkloadInfo(
        name=workload.source if not workload.source.startswith("builtin:") else workload.name,
        prompts=len(case.prompts),
        sha256=workload.sha256,
        max_new_tokens=max(case.max_new_tokens),
        temperature=case.temperature,
    )


def search_info(result: TuneResult, settings: TuneSettings) -> SearchInfo:
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


def batch_row(
    batch_size: int, result: TuneResult, model: CostModel | None = None, max_gamma: int = 0
) -> BatchRow:
    """The batch table row of one batch size's search: its best, each draft's best, and the cost
    model's best prediction there (`model`: search.costmodel.CostModel); without one, what an
    engine's model fitted from trials predicted for the best before it was measured (None: no
    prediction)."""
    per_draft: dict[str, Any] = {}
    for r in result.results:  # best first: the first of each draft is its best
        if r.config.gamma > 0:
            per_draft.setdefault(r.config.draft.name, r)
    ranked = model.rank(max_gamma, batch_size=batch_size) if model is not None else []
    predicted = max(1.0, ranked[0][2]) if ranked else None
    if model is None and result.results[0].config.gamma > 0:
        predicted = result.results[0].metrics.predicted_speedup
    return BatchRow(
        batch_size, result.results[0], list(per_draft.values()), predicted, result.study_name,
        result.confirmed_from,
    )  # fmt: skip


def build_profile(
    result: TuneResult,
    settings: TuneSettings,
    hardware: dict[str, Any],
    engine: EngineFields,
    *,
    workload: WorkloadInfo,
    costs: Costs | None,
    noise: Noise | None = None,
    anchors: Anchors | None = None,
) -> Profile:
    """The profile of a finished search at its first batch size (`result`: search.results.TuneResult)."""
    return Profile(
        hardware=hardware,
        target=engine.target,
        workload=workload,
        costs=costs,
        search=search_info(result, settings),
        best=result.results[0],
        # The baseline has its own section; as an alternative it would only take a config's place.
        alternatives=[r for r in result.results[1:] if r.config.gamma > 0][:4],
        baseline=result.baseline,
        engine_mode=engine.engine_mode,
        compile_fallbacks=list(engine.compile_fallbacks),
        engine_choice=engine.engine_choice,
        backend=engine.backend,
        noise=noise,
        anchors=anchors,
        compile=engine.compile,
        versions=dict(engine.versions),
        created=created_now(),
    )


def with_batch_table(profile: Profile, rows: list[BatchRow], predicted_b_star: int | None = None) -> Profile:
    """The profile with its batch table and B*: the smallest measured batch size whose best is
    plain decoding (None: speculation won at every measured batch size)."""
    profile.batch_table = rows
    losing = [row.batch_size for row in rows if row.best.config.gamma == 0]
    profile.b_star = min(losing) if losing else None
    profile.predicted_b_star = predicted_b_star
    return profile


def context_row(
    context_length: int,
    batch_size: int,
    result: TuneResult,
    prompt_tokens: int,
    predicted: float | None = None,
    measured: WorkloadInfo | None = None,
) -> ContextRow:
    """The envelope cell of one (B, L) search: its best, each draft's best, T_target(L) from the
    plain side measured beside them, the prediction of its best made before it was measured, and
    what a pass measured there (`measured`: its session's workload, prompts and reply length)."""
    per_draft: dict[str, Any] = {}
    for r in result.results:  # best first: the first of each draft is its best
        if r.config.gamma > 0:
            per_draft.setdefault(r.config.draft.name, r)
    base = result.baseline.tokens_per_s if result.baseline is not None else 0.0
    return ContextRow(
        context_length=context_length,
        batch_size=batch_size,
        best=result.results[0],
        prompt_tokens=prompt_tokens,
        per_draft=list(per_draft.values()),
        t_target_ms=round(1000.0 / base, 4) if base > 0 else None,
        predicted_speedup=predicted,
        study_name=result.study_name,
        confirmed_from=result.confirmed_from,
        prompts=measured.prompts if measured is not None else None,
        max_new_tokens=measured.max_new_tokens if measured is not None else None,
    )


def envelope_lines(rows: list[ContextRow]) -> list[EnvelopeLine]:
    """Per batch size, along L: L* (the shortest L whose best is plain decoding) and each change of
    the best draft kind between neighbouring lengths.

        B=1: L 256 ngram-simple 1.2x, L 2048 ngram-mod 1.1x, L 6144 plain
          -> l_star 6144, kind_changes ["ngram-simple -> ngram-mod at L 2048", "ngram-mod -> none at L 6144"]
    """
    lines = []
    for b in sorted({r.batch_size for r in rows}):
        along = sorted((r for r in rows if r.batch_size == b), key=lambda r: r.context_length)
        plain = [r.context_length for r in along if r.best.config.gamma == 0]
        changes = []
        for before, after in pairwise(along):
            k0, k1 = draft_family(before.best), draft_family(after.best)
            if k0 != k1:
                changes.append(f"{k0} -> {k1} at L {after.context_length}")
        lines.append(EnvelopeLine(b, min(plain) if plain else None, changes))
    return lines


def draft_family(result: Result) -> str:
    """A result's kind of draft as a person names it: the draft's name without its parameters
    ("ngram-simple:4" -> "ngram-simple", "hybrid:prompt-lookup+draft-1l" -> "hybrid"); "none" for plain."""
    return "none" if result.config.gamma == 0 else result.config.draft.name.split(":")[0]


def with_envelope(profile: Profile, rows: list[ContextRow]) -> Profile:
    """The profile with its context table (sorted by B, then L) and the envelope lines."""
    profile.context_table = sorted(rows, key=lambda r: (r.batch_size, r.context_length))
    profile.envelope = envelope_lines(profile.context_table)
    return profile
