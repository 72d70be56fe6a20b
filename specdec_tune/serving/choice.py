"""Which measured config an engine gets: the profile's best (or a batch-table row's best) when the
engine runs it as measured (capabilities.blockers), else the best ranked alternative it runs that
beats plain decoding, with a warning that says what was lost; or nothing, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..domain import Result
from ..store.schema import Profile
from .capabilities import blockers, engine_info
from .schedule import row_for_load


@dataclass
class Choice:
    result: Result | None  # what to export; None: nothing (`nothing` says why)
    lost: list[str] = field(default_factory=list)  # why the best cannot run there as measured
    nothing: str = ""
    fallback: str = ""  # the warning when an alternative replaces the best


def measured_in(profile: Profile) -> str | None:
    """The serving engine a profile was measured inside (its measuring backend), None for ours."""
    backend = profile.backend
    return str(backend.name) if backend.build else None  # an engine of its own build, not ours


def choose(profile: Profile, engine: str) -> Choice:
    """The profile's best if `engine` runs it as measured, else the first ranked alternative that it
    runs and that beats plain decoding."""
    best, display, where = profile.best, engine_info(engine).display, measured_in(profile)
    lost = blockers(best.config, engine, where)
    if not lost:
        return Choice(best)
    chosen = next(
        (
            r
            for r in profile.alternatives
            if r.config.draft.kind != "none"
            and r.metrics.speedup > 1.0
            and not blockers(r.config, engine, where)
        ),
        None,
    )
    if chosen is None:
        why = (
            f"nothing in the profile runs on {display} as measured and beats plain decoding; "
            f"best {best.config.label}: {'; '.join(lost)}"
        )
        return Choice(None, lost, why)
    return Choice(chosen, lost, fallback=_fallback_warning(best, chosen, display, lost))


def choose_at_load(profile: Profile, engine: str, load: int) -> Choice:
    """The best config `engine` runs as measured at the batch table row that holds `load`."""
    row, display, where = row_for_load(profile, load), engine_info(engine).display, measured_in(profile)
    at = f" at batch size {row.batch_size}"
    if row.best.config.draft.kind == "none":
        return Choice(
            None,
            nothing=f"plain decoding was fastest{at} (the row for a load of {load}): nothing to speculate with",
        )
    lost = blockers(row.best.config, engine, where)
    if not lost:
        return Choice(row.best)
    ranked = sorted(row.per_draft, key=lambda r: -r.metrics.speedup)
    chosen = next(
        (r for r in ranked if r.metrics.speedup > 1.0 and not blockers(r.config, engine, where)), None
    )
    if chosen is None:
        why = (
            f"nothing measured{at} runs on {display} as measured and beats plain decoding; "
            f"best {row.best.config.label}: {'; '.join(lost)}"
        )
        return Choice(None, lost, why)
    return Choice(chosen, lost, fallback=_fallback_warning(row.best, chosen, display, lost, at))


def _fallback_warning(best: Result, chosen: Result, display: str, lost: list[str], where: str = "") -> str:
    loss = best.metrics.speedup - chosen.metrics.speedup
    return (
        f"the best config {best.config.label}{where} (measured {best.metrics.speedup:.3f}x) cannot run on "
        f"{display} as measured: {'; '.join(lost)}. Exported instead the best measured config it "
        f"can run: {chosen.config.label}, measured {chosen.metrics.speedup:.3f}x ({loss:.3f}x less)"
    )
