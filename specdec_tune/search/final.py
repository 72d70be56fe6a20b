"""The final round: after the search, the top configs and the baseline are re-measured head to
head in one interleaved run, and the winner comes from that round.

Each search trial is one short noisy measurement, and the highest of many noisy values is biased
upwards (the winner's curse): a config can top the search on one lucky trial. The finalists (at
least the top two distinct configs) get fresh measurements timed side by side, which are unbiased
and directly comparable, and rounds are added until the winner is resolved (`racing`); unresolved,
the round is a tie within noise: the fastest of the round is kept and the tied configs are named.
A search trial above what the cost model allows at any acceptance, or whose own repeats disagree
wildly, is an outlier: it sets no bar for the others and is only promoted by its final-round
measurement.

One round per study: the round is keyed by its finalists and stored in the study. Workers that
finish together take a lock shared through the storage (`storage.StorageLock`); the first one
measures and stores the round, the others wait for the lock and then reuse what it stored, so
every worker ranks by the same round. A worker that dies while measuring drops the lock with its
connection, and the next one measures instead. A failed round is stored too, so all workers fall
back to the same search ranking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..domain import Config, Metrics, Result
from ..measure.seam import Case, MeasuringBackend
from ..measure.stats import speedup_interval
from ..measure.timing import median, spread
from .racing import BASELINE, race
from .results import TuneResult, csv_row
from .space import TuneSettings
from .study import WORKER

if TYPE_CHECKING:
    import optuna

    from .storage import StorageLock

# A search trial above the cost model's ceiling (every draft token accepted) by more than this
# factor, or whose repeats spread more than OUTLIER_SPREAD, is not believed until re-measured.
CEILING_MARGIN = 1.15
OUTLIER_SPREAD = 0.5
# A finalist measured in a later racing round gets this many more interleaved repeats per round.
MIN_STEP_REPEATS = 2

Ceiling = Callable[[Config], "float | None"]
# What a pinned finalist that no search trial measured carries into the round.
UNMEASURED = Metrics(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, repeats=0)


def is_outlier(result: Result, ceiling: Ceiling | None = None) -> bool:
    """A search trial not to be believed: above the cost model's ceiling for its config, or far
    outside its own repeats."""
    m = result.metrics
    if result.config.gamma == 0:
        return False
    top = ceiling(result.config) if ceiling is not None else None
    return (top is not None and m.speedup > CEILING_MARGIN * top) or m.speedup_spread > OUTLIER_SPREAD


def pick_finalists(
    results: list[Result], k: int, floor: float = 0.75, ceiling: Ceiling | None = None
) -> list[Result]:
    """The configs worth re-measuring: the best of each draft first, then the next best overall.

    `results` is best first by search speedup. One best per draft comes first so that a single
    lucky trial of one draft cannot crowd out the others; a config below `floor` × the best
    believable search speedup is not a contender, except that the top two always are (a head to
    head needs two). Outliers (`is_outlier`) set no bar and only take a slot that is left over.
    """
    contenders = [r for r in results if r.config.gamma > 0]
    if not contenders or k <= 0:
        return []
    credible = [r for r in contenders if not is_outlier(r, ceiling)]
    odd = [r for r in contenders if is_outlier(r, ceiling)]
    if credible:
        cut = floor * max(r.metrics.speedup for r in credible)
        credible = credible[:2] + [r for r in credible[2:] if r.metrics.speedup >= cut]
    chosen: list[Result] = []
    for r in credible:
        if len(chosen) < k and all(c.config.draft.name != r.config.draft.name for c in chosen):
            chosen.append(r)
    for r in credible + odd:
        if len(chosen) < k and all(c is not r for c in chosen):
            chosen.append(r)
    return sorted(chosen, key=lambda r: -r.metrics.speedup)


def demote_outliers(results: list[Result], ceiling: Ceiling | None) -> list[Result]:
    """`results` with the outliers moved behind every believable config (order kept otherwise)."""
    return [r for r in results if not is_outlier(r, ceiling)] + [r for r in results if is_outlier(r, ceiling)]


def final_round(
    study: optuna.Study,
    result: TuneResult,
    backend: MeasuringBackend,
    case: Case,
    settings: TuneSettings,
    on_start: Callable[[list[str]], None] | None = None,
    claim: StorageLock | None = None,
    ceiling: Ceiling | None = None,
    pinned: list[Config] | None = None,
) -> None:
    """Race the finalists against each other and the baseline; rank by this round, the rest follow.

    `pinned` configs (an engine's own defaults) race among the finalists whatever the search found,
    so the answer is never below them and the profile shows them measured head to head.

    The round is stored in the study, so rerunning a finished study reuses it. Updates `result`
    in place. A failing round (a draft that no longer loads, out of memory) keeps the search's
    ranking, outliers last, and says why in `result.final_note`.
    """
    result.outliers = [r.config.label for r in result.results if is_outlier(r, ceiling)]
    result.results = demote_outliers(result.results, ceiling)
    finalists = pick_finalists(result.results, max(2, settings.finalists), settings.final_floor, ceiling)
    keys = {r.config.key for r in finalists}
    finalists += [Result(c, UNMEASURED) for c in pinned or [] if c.key not in keys]
    if not finalists:
        return
    key = {
        "trials": result.trials,
        "configs": [list(r.config.key) for r in finalists],  # JSON-shaped, as stored
        # as asked: workers whose noise raised the repeats differently still share one round
        "repeats": settings.final_repeats_asked or settings.final_repeats,
    }
    if settings.final_repeats_cap is not None:  # a round capped otherwise is another round
        key["cap"] = settings.final_repeats_cap
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
    chosen = stored.get("chosen")  # absent in a round stored before racing: the fastest
    first = head[:1] if chosen is None else base[:1] if chosen == BASELINE else [final[chosen]]
    head = first + [r for r in head if all(r is not f for f in first)]
    picked = {r.config.key for r in final}
    rest = [r for r in result.results if r.config.gamma > 0 and r.config.key not in picked]
    result.results = head + rest
    result.finalists = len(final)
    result.final_verdict = stored.get("verdict", "")
    result.final_margin = list(stored.get("margin") or [])
    result.final_tied = [_label(final, i) for i in stored.get("tied") or []]
    result.final_repeats = max(m.repeats for m in measured)
    for r in final:
        result.rows.append(csv_row(None, "FINAL", r.config, r.metrics.speedup, r.metrics.as_dict()))


def _label(final: list[Result], i: int) -> str:
    return "no speculation" if i == BASELINE else final[i].config.label


def _stored(study: optuna.Study, key: dict[str, Any]) -> dict[str, Any] | None:
    stored = study.user_attrs.get("final_round")
    return stored if isinstance(stored, dict) and stored.get("key") == key else None


def _measure(
    finalists: list[Result],
    backend: MeasuringBackend,
    case: Case,
    settings: TuneSettings,
    on_start: Callable[[list[str]], None] | None,
) -> dict[str, Any]:
    """The round as stored: {"metrics": [...], "chosen", "verdict", "margin", "worker"} or
    {"error": why it did not run}."""
    if on_start is not None:
        on_start([r.config.label for r in finalists])
    configs = [r.config for r in finalists]
    parts: dict[int, list[Metrics]] = {i: [] for i in range(len(configs))}

    def measure_round(indices: list[int], repeats: int, rnd: int) -> list[list[float]]:
        ms = backend.measure(
            [configs[i] for i in indices], case, settings.batch_size, repeats, seed=settings.seed + 1000 * rnd
        )
        for i, m in zip(indices, ms, strict=True):
            parts[i].append(m.metrics)
        return [list(m.speedups or [m.metrics.speedup]) for m in ms]

    try:
        outcome = race(
            configs,
            measure_round,
            settings.final_repeats,
            max(MIN_STEP_REPEATS, settings.final_repeats // 2),
            settings.final_max_repeats,
            settings.final_budget_s,
            seed=settings.seed,
        )
    except Exception as exc:  # e.g. a draft that no longer loads: keep the search's ranking
        return {"error": f"final round skipped: {type(exc).__name__}: {exc}"[:300], "worker": WORKER}
    measured = []
    for i, r in enumerate(finalists):
        samples = [outcome.samples[i][k] for k in sorted(outcome.samples[i])]
        m = pool(parts[i], samples, settings.seed)
        m.predicted_speedup = r.metrics.predicted_speedup
        m.search_speedup = r.metrics.speedup if r.metrics is not UNMEASURED else None
        measured.append(m.as_dict())
    margin = outcome.margin
    return {
        "metrics": measured,
        "chosen": outcome.chosen,
        "verdict": outcome.verdict,
        "margin": [round(margin.ratio, 4), *(round(x, 4) for x in margin.interval)] if margin else [],
        "rounds": outcome.rounds,
        "tied": list(outcome.tied),
        "worker": WORKER,
    }


def pool(parts: list[Metrics], samples: list[float], seed: int = 0) -> Metrics:
    """One config's metrics over several rounds: the speedup from every per-repeat ratio, rates
    and acceptance averaged by repeats."""
    n = sum(p.repeats for p in parts)

    def mean(name: str) -> float:
        return sum(getattr(p, name) * p.repeats for p in parts) / n

    first = parts[0]
    return Metrics(
        tokens_per_s=mean("tokens_per_s"),
        baseline_tokens_per_s=mean("baseline_tokens_per_s"),
        speedup=median(samples),
        speedup_spread=spread(samples),
        acceptance_rate=mean("acceptance_rate"),
        mean_accepted_len=mean("mean_accepted_len"),
        per_position_acceptance=list(first.per_position_acceptance),
        repeats=len(samples),
        per_source=dict(first.per_source),
        speedup_samples=[round(s, 5) for s in samples],
        speedup_interval=speedup_interval(samples, seed),
    )
