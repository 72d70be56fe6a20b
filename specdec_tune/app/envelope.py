"""The serving envelope: `run --context-lengths` searches every (batch size, context length) cell,
one measuring session per length (its prompts fitted to that length with real text, its engine
sized to it), and writes one profile whose best is the shortest length's, with the table of cells,
T_target(L), L* per batch size and where the best draft kind changes (store.build.with_envelope).

The budget is shared evenly among the lengths still to search, re-planned from what is left after
each one, so a slow long length cannot take the time of the next. In a budgeted run only the
shortest length is searched: each longer one races the shortest's best config of each draft (every
draft once, `search.cells.every_draft`) and the engine's defaults head to head against plain, its
cells marked `confirmed_from: L=...`. A length past the target's
trained positions is left out in one line (errors.ContextTooLong), not the whole run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..backends.base import Models, Progress
from ..errors import ContextTooLong, SpecDecError
from ..search.space import TuneSettings
from ..store.build import context_row, with_envelope
from ..store.runfiles import save_run
from .common import TuneOutcome
from .run_options import SearchInputs
from .session_engine import predicted_best
from .session_search import SessionRun, search_session

if TYPE_CHECKING:
    from ..search.results import TuneResult


def tune_envelope(
    models: Models,
    settings: TuneSettings,
    inputs: SearchInputs,
    out: Path | None,
    progress: Progress,
    *,
    batch_sizes: list[int],
    budget_s: float | None,
    context_lengths: list[int],
    started: float,
) -> TuneOutcome:
    """Search each (B, L) cell and write one profile with the envelope (see the module docstring)."""
    lengths = sorted(set(context_lengths))
    runs: dict[int, SessionRun] = {}
    for i, length in enumerate(lengths):
        budget_i = None
        if budget_s is not None:
            spent = time.monotonic() - started
            budget_i = spent + max(0.0, budget_s - spent) / (len(lengths) - i)
        settings_l = settings
        if settings.study_name:
            settings_l = replace(settings, study_name=f"{settings.study_name}-L{length}")
        progress.stage(f"context length {length}", i / len(lengths))
        try:
            runs[length] = search_session(
                replace(models, context_length=length), settings_l, inputs, out, progress, batch_sizes=batch_sizes, budget_s=budget_i, started=started,
                confirm=_confirm(runs, batch_sizes[0]),
                carry=runs[min(runs)] if runs else None,
            )  # fmt: skip
        except ContextTooLong as exc:
            progress.note(str(exc))
            continue
        out = runs[length].out  # every length writes the one profile the first chose
    if not runs:
        raise SpecDecError(
            f"no context length could be measured: {', '.join(map(str, lengths))} are all past the "
            "target's positions; pass shorter --context-lengths"
        )
    first = runs[min(runs)]
    rows = [
        context_row(
            length, b, run.results[b], run.prompt_tokens, predicted_best(run.results[b]), run.profile.workload
        )
        for length, run in runs.items()
        for b in batch_sizes
    ]
    profile = with_envelope(first.profile, rows)
    trial_rows = [{**row, "context_length": length} for length, run in runs.items() for row in run.trial_rows]
    profile, csv_path = save_run(profile, first.out, trial_rows, settings.force)
    return TuneOutcome(profile, first.out, csv_path, first.results[batch_sizes[0]], first.results)


def _confirm(runs: dict[int, SessionRun], batch_size: int) -> tuple[str, TuneResult] | None:
    """The shortest measured length's search at `batch_size`, whose configs a longer length races
    instead of searching (None before any length was measured)."""
    if not runs:
        return None
    first = min(runs)
    return f"L={first}", runs[first].results[batch_size]
