"""`check` of a profile's serving envelope (`run --context-lengths`): every stored (B, L) cell not
already judged as the best or a batch row is re-measured at its context length, one measuring
session per length (backends.base, so every engine alike), and judged by the same rules."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..backends.base import Purpose, open_session
from ..checkpolicy import CheckPolicy
from ..measure import noise
from ..output.check import CheckItem, Evidence, confirm_repeats, judge_config, needs_confirmation
from ..output.environment import classify
from ..store.schema import ContextRow, Profile
from .check_session import session_models


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
    p: Profile,
    path: Path,
    *,
    tolerance: float,
    acceptance_tolerance: float | None,
    repeats: int,
    policy: CheckPolicy,
    device: str = "auto",
    server: str | None = None,
) -> list[CheckItem]:
    """The items of every cell `cells_to_check` names, each re-measured with its prompts fitted to
    its context length, in one session per length."""
    folder = Path(path).parent
    by_length: dict[int, list[ContextRow]] = {}
    for r in cells_to_check(p):
        by_length.setdefault(r.context_length, []).append(r)
    items: list[CheckItem] = []
    cpus = os.cpu_count() or 1
    for length, rows in sorted(by_length.items()):
        drafts = [r.best.config.draft for r in rows if r.best.config.gamma > 0]
        models = session_models(p, folder, drafts, server=server, device=device, context_length=length)
        # what a pass measured at this length, when the budget cut it (one session: every B alike)
        models = replace(
            models,
            prompts=rows[0].prompts or models.prompts,
            max_new_tokens=rows[0].max_new_tokens or models.max_new_tokens,
        )
        with open_session(models, Purpose("check", batch_size=rows[0].batch_size)) as s:
            by_name = {d.name: d for d in s.specs}
            for r in rows:
                config = replace(
                    r.best.config, draft=by_name.get(r.best.config.draft.name, r.best.config.draft)
                )

                def once(config: Any = config, b: int = r.batch_size) -> Any:
                    return s.measure([config], s.case, b, repeats)[0]

                m, os_noise, _ = noise.busy_window(once)
                env = classify(os_noise, policy, threads=s.threads, cpus=cpus)
                e = Evidence(
                    r.best, m, temperature=p.workload.temperature, environment=env,
                    where=f" @ B={r.batch_size}, L={length}",
                )  # fmt: skip
                if needs_confirmation(e, tolerance, policy):
                    (again,) = s.measure([config], s.case, r.batch_size, confirm_repeats(m, repeats, policy))
                    e = replace(e, again=again)
                items += judge_config(e, tolerance, acceptance_tolerance=acceptance_tolerance, policy=policy)
    return items
