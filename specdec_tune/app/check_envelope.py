"""`check` of a profile's serving envelope (`run --context-lengths`): every stored (B, L) cell not
already judged as the best or a batch row is re-measured at its context length, one measuring
session per length (backends.base, so every engine alike), and judged by the same rules."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..backends.base import Purpose, open_session
from ..output.check import CheckItem
from ..store.schema import ContextRow, Profile
from .check_rows import Judging, row_items, where_of
from .profile_models import stored_models


def cells_to_check(p: Profile) -> list[ContextRow]:
    """The envelope's cells that the best and batch-table items do not already judge: every cell
    at another length than the profile's best was measured at, and that length's other batch sizes."""
    judged = {1} | {r.batch_size for r in p.batch_table}
    return [
        r
        for r in p.context_table
        if r.context_length != p.workload.context_length or r.batch_size not in judged
    ]


def check_cells(
    p: Profile, path: Path, j: Judging, *, device: str = "auto", server: str | None = None
) -> list[CheckItem]:
    """The items of every cell `cells_to_check` names, each re-measured with its prompts fitted to
    its context length, in one session per length (app.check_rows)."""
    by_length: dict[int, list[ContextRow]] = {}
    for r in cells_to_check(p):
        by_length.setdefault(r.context_length, []).append(r)
    items: list[CheckItem] = []
    for length, rows in sorted(by_length.items()):
        drafts = [r.best.config.draft for r in rows if r.best.config.gamma > 0]
        models = stored_models(p, path, drafts, server=server, device=device, context_length=length)
        # what a pass measured at this length, when the budget cut it (one session: every B alike)
        models = replace(
            models,
            prompts=rows[0].prompts or models.prompts,
            max_new_tokens=rows[0].max_new_tokens or models.max_new_tokens,
        )
        with open_session(models, Purpose("check", batch_size=rows[0].batch_size, costs=p.costs)) as s:
            by_name = {d.name: d for d in s.specs}
            for r in rows:
                config = replace(
                    r.best.config, draft=by_name.get(r.best.config.draft.name, r.best.config.draft)
                )
                where = where_of(r.batch_size, length)
                items += row_items(s, r.best, config, r.batch_size, j, p.workload.temperature, where)
    return items
