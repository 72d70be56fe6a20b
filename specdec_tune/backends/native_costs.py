"""The costs profile of our own engine: T_target, C_ver(γ), T_draft and acceptance measured in this
process (measure.costs), and with several batch sizes the cost surface over them (measure.surface)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..domain import Costs, DraftSpec
from .base import Progress

if TYPE_CHECKING:
    from ..runtime.session import Session
    from .native_pool import DrafterPool


def measure_costs(
    s: Session,
    pool: DrafterPool,
    max_gamma: int,
    repeats: int,
    progress: Progress,
    batch_sizes: list[int] | None = None,
    context_len: int | None = None,
    carry: Costs | None = None,
) -> Costs:
    """The costs profile of a session's target and drafts; with `batch_sizes` (other than just
    [1]) also the cost surface over them. `context_len` defaults to the workload's typical
    mid-generation length. Acceptance is measured only where both models have trained weights;
    the costs say which weights were random. `carry`: the costs of an envelope's first length,
    whose context-independent terms are taken instead of measured again (measure.costs,
    measure.surface.carried_loop_terms)."""
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
        carry=carry,
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
            carry=carry,
        )
    costs.compile_fallbacks = list(s.ctx.fallbacks)
    costs.compile = s.ctx.compile_time()  # graph builds so far, never inside a timing
    costs.engine_choice = s.ctx.auto.summary() if s.ctx.auto else None
    return costs


def acceptance_measured(s: Session, spec: DraftSpec) -> bool:
    """Whether the profiler measures this drafter's acceptance: prompts, and trained weights on both sides."""
    from ..runtime.session import has_random_weights

    return s.case is not None and s.target.weights == "trained" and not has_random_weights(spec)
