"""The main use case: profile the costs, search at each batch size, and write the winning profile.
One pipeline for every backend: everything engine-specific is asked of its measuring session
(backends.base.MeasuringSession)."""

from __future__ import annotations

import time
from pathlib import Path

from ..backends.base import Models, Progress
from ..checkpolicy import CHECK_POLICY
from ..domain import Noise
from ..errors import SpecDecError
from ..limits import check_count
from ..measure.hardware import machine_id
from ..measure.noise import busy
from ..search.space import TuneSettings
from ..store.runfiles import save_run
from ..store.schema import Profile
from ..store.yamlio import save_profile
from .common import TuneOutcome, check_writable
from .envelope import tune_envelope
from .reference import settle, slice_rows, store_reference
from .run_options import Envelope, SearchInputs
from .session_search import search_session


def tune(
    models: Models,
    settings: TuneSettings | None = None,
    inputs: SearchInputs | None = None,
    out: Path | None = None,
    progress: Progress | None = None,
    *,
    envelope: Envelope | None = None,
    budget_s: float | None = None,
) -> TuneOutcome:
    """Profile the costs, search at each batch size, and write the winning profile (default
    `profiles/<hardware>/<target>.yaml`, `<target>.<engine>.yaml` for an engine backend) with the
    trials CSV beside it.

    `inputs`: what the search starts from beside the models' drafts (default: the costs profiled
    here); `envelope`: the batch sizes (default: the settings' one) and context lengths to search.

    With `budget_s` and no fixed `settings.trials`, the number of trials is sized from the time
    one plain pass takes on this machine so the whole search, final rounds included, fits the
    budget (search.budget); the profile says what the budget allowed.

    With `envelope.context_lengths` every (batch size, context length) cell is searched, the prompts fitted
    to each length with real text (app.envelope): the profile's best is the shortest length's.
    """
    started = time.monotonic()
    settings = settings or TuneSettings()
    inputs = inputs or SearchInputs()
    envelope = envelope or Envelope()
    progress = progress or Progress()
    batch_sizes = sorted(set(envelope.batch_sizes or [settings.batch_size]))
    for b in batch_sizes:
        check_count(b, "--batch-sizes")
    if budget_s is not None and not budget_s > 0:
        raise SpecDecError(f"--budget must be > 0 seconds, got {budget_s}")
    if out is not None:
        check_writable(out)
    if envelope.context_lengths:
        return tune_envelope(
            models, settings, inputs, out, progress, batch_sizes=batch_sizes, budget_s=budget_s,
            context_lengths=envelope.context_lengths, started=started,
        )  # fmt: skip
    run = search_session(
        models, settings, inputs, out, progress, batch_sizes=batch_sizes, budget_s=budget_s, started=started
    )
    if not (run.fresh_reference or run.slices) and run.profile.anchors is not None:
        # a server engine without a check slice (vLLM): its rates came from servers it started fresh,
        # this machine's level as `check` will measure it, so this machine may judge them again
        run.profile.anchors.machine = machine_id()
    profile, csv_path = save_run(run.profile, run.out, run.trial_rows, settings.force)
    if (run.fresh_reference or run.slices) and settings.reference_processes and profile.anchors is not None:
        left = reference_seconds(budget_s, time.monotonic() - started, run.reference_s)
        profile = _reference(
            profile, run.out, settings.reference_processes, left, run.noise, progress, run.threads,
            sliced=run.slices,
        )  # fmt: skip
    return TuneOutcome(profile, run.out, csv_path, run.results[batch_sizes[0]], run.results)


def reference_seconds(budget_s: float | None, spent_s: float, reserved_s: float) -> float | None:
    """What the reference processes may take: what is left of the budget, and never less than the
    reserve the plan kept for them before the search. A search that ran over its share (the least
    search at three batch sizes is more than a 240 s budget holds) used to leave them nothing: the
    README's run then ended "3 of 3 reference processes did not fit the budget", and `check` judged
    against the one process of the run, whose speed level a fresh process does not share (a planted
    15 % slowdown passed a quiet check at 0.901 of stored, stop 58). None: no budget."""
    return None if budget_s is None else max(budget_s - spent_s, reserved_s)


def _reference(
    profile: Profile, out: Path, processes: int, left_s: float | None, noise: Noise, progress: Progress,
    threads: int | None = None,
    *,
    sliced: bool = True,
) -> Profile:  # fmt: skip
    """The tokens/s `check` will judge against, measured in fresh processes (app.reference) with the
    run's engine `threads` (on a CPU: on the check slice, measure.narrow, which `check` then
    measures on too), and stored in the profile's anchors. Skipped on a busy machine, whose rates
    `check` never judges, unless on the slice: each process there says whether its own core was
    busy, and is left out if it was (app.reference)."""
    sliced = sliced and profile.hardware.get("kind") == "cpu"  # `sliced`: the engine's `slices`
    if busy(noise) and not sliced:
        progress.note("no reference for check's plain tokens/s: the machine was busy during the run")
        return profile
    rows = slice_rows(profile) if sliced else 1
    # One process at a time until `processes` quiet ones agree (the policy's `reference_agreement`),
    # up to `extra_processes` more, within the time left: the largest agreeing group is kept.
    policy = CHECK_POLICY
    settled = settle(
        out, processes, processes + policy.extra_processes, left_s, noise.plain_pass_s, threads,
        sliced=sliced, rows=rows, policy=policy,
    )  # fmt: skip
    if settled.notes:
        progress.note("; ".join(settled.notes))
    least = policy.min_reference_processes
    if len(settled.kept) < least:
        progress.note(
            f"fewer than {least} quiet reference processes: check judges plain tokens/s "
            "against the final round"
        )
        return profile
    kept = settled.kept
    if len(settled.group) >= least:
        kept = [settled.kept[i] for i in settled.group]
    else:
        progress.note(
            f"the reference processes' speedups ({settled.speeds}) do not agree within "
            f"{policy.reference_agreement:.0%}: a check against them can tell only a larger drop; "
            "`specdec-tune reference` measures them again"
        )
    store_reference(profile, kept)
    save_profile(profile, out)
    return profile
