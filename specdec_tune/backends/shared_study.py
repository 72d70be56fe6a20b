"""`--engine auto` on a shared study: every worker of one study runs the engine mode the first
worker resolved, recorded in the study (`search.study.agree_engine_mode`), instead of timing `auto`
on its own and perhaps choosing differently (workers on one machine time at the same moment and
may disagree; a study mixing modes compares configs under different engines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..domain import DraftSpec
from ..runtime.caches.auto import resolve_auto
from ..runtime.caches.modes import AutoChoice, ExecutionContext
from ..search.space import TuneSettings
from ..search.study import agree_engine_mode, default_storage
from ..search.tuner import study_name

if TYPE_CHECKING:
    from ..runtime.session import Session


def settle_auto(
    s: Session, specs: list[DraftSpec], settings: TuneSettings, study_key: dict[str, Any]
) -> None:
    """Give session `s` (opened without resolving `auto`) the study's engine mode: recorded by an
    earlier worker, else resolved here (`runtime.caches.auto`) and recorded for the others."""
    name = study_name(specs, settings, study_key)
    mine: list[AutoChoice] = []

    def resolve() -> str:
        mine.append(resolve_auto(s.device, s.target.model))
        return mine[0].choice

    shared = agree_engine_mode(name, settings.storage or default_storage(), resolve, 3 * settings.grace_s)
    auto = mine[0] if shared is None else AutoChoice(shared, reason=f"recorded in study {name}")
    s.ctx = ExecutionContext(auto.choice, s.ctx.capacity, s.ctx.device, s.ctx.dtype, auto=auto)
