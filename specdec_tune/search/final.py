"""The final round: after the search, the top configs and the baseline are re-measured head to
head in one interleaved run, and the winner comes from that round.

Each search trial is one short noisy measurement, and the highest of many noisy values is biased
upwards (the winner's curse): a config can top the search on one lucky trial. The finalists get
fresh measurements timed side by side, which are unbiased and directly comparable.

One round per study: the round is keyed by its finalists and stored in the study. Workers that
finish together take a lock shared through the storage (`storage.StorageLock`); the first one
measures and stores the round, the others wait for the lock and then reuse what it stored, so
every worker ranks by the same round. A worker that dies while measuring drops the lock with its
connection, and the next one measures instead. A failed round is stored too, so all workers fall
back to the same search ranking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..domain import Metrics, Result
from .results import TuneResult, csv_row
from .space import TuneSettings


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
    backend: Any,
    case: Any,
    settings: TuneSettings,
    on_start: Callable[[list[str]], None] | None = None,
    claim: Any = None,
) -> None:
    """Re-measure the finalists and the baseline; rank them by this round, the rest follow.

    The round is stored in the study, so rerunning a finished study reuses it. Updates `result`
    in place. A failing round (a draft that no longer loads, out of memory) keeps the search's
    ranking and says why in `result.final_note`.
    """
    finalists = pick_finalists(result.results, settings.finalists, settings.final_floor)
    if not finalists:
        return
    key = {
        "trials": result.trials,
        "configs": [list(r.config.key) for r in finalists],  # JSON-shaped, as stored
        "repeats": settings.final_repeats,
    }
    # Another worker may be measuring this round: wait for it (or for its death).
    waiting = claim is not None and _stored(study, key) is None
    if waiting and not claim.acquire(timeout_s=settings.final_wait_s):
        result.final_note = (
            f"final round skipped: another worker was still measuring it after "
            f"{settings.final_wait_s:.0f} s; ranked by the search"
        )
        return
    try:
        stored = _stored(study, key)
        if stored is None:
            stored = _measure(finalists, backend, case, settings, on_start)
            study.set_user_attr("final_round", {"key": key, **stored})
    finally:
        if claim is not None:
            claim.release()
    if "error" in stored:
        result.final_note = stored["error"]
        return
    measured = [Metrics.from_dict(m) for m in stored["metrics"]]
    final = [Result(r.config, m) for r, m in zip(finalists, measured, strict=True)]
    base = [r for r in result.results if r.config.gamma == 0]
    head = sorted(final + base, key=lambda r: -r.metrics.speedup)
    picked = {r.config.key for r in final}
    rest = [r for r in result.results if r.config.gamma > 0 and r.config.key not in picked]
    result.results = head + rest
    result.finalists = len(final)
    for r in final:
        result.rows.append(csv_row(None, "FINAL", r.config, r.metrics.speedup, r.metrics.as_dict()))


def _stored(study: Any, key: dict[str, Any]) -> dict[str, Any] | None:
    stored = study.user_attrs.get("final_round")
    return stored if isinstance(stored, dict) and stored.get("key") == key else None


def _measure(
    finalists: list[Result],
    backend: Any,
    case: Any,
    settings: TuneSettings,
    on_start: Callable[[list[str]], None] | None,
) -> dict[str, Any]:
    """The round as stored: {"metrics": [...], "worker": ...} or {"error": why it did not run}."""
    from .study import WORKER

    if on_start is not None:
        on_start([r.config.label for r in finalists])
    try:
        ms = backend.measure(
            [r.config for r in finalists],
            case,
            settings.batch_size,
            settings.final_repeats,
            seed=settings.seed,
        )
    except Exception as exc:  # e.g. a draft that no longer loads: keep the search's ranking
        return {"error": f"final round skipped: {type(exc).__name__}: {exc}"[:300], "worker": WORKER}
    measured = []
    for r, m in zip(finalists, ms, strict=True):
        m.metrics.predicted_speedup = r.metrics.predicted_speedup
        m.metrics.search_speedup = r.metrics.speedup
        measured.append(m.metrics.as_dict())
    return {"metrics": measured, "worker": WORKER}
