"""The Optuna study behind a search: where it is stored, what it is called, who may join it, and
how many of its trials count. Public Optuna API only.

A study is named after everything that changes the answer (tool version, hardware, target,
workload, budget, space), so rerunning a command resumes it and an upgrade starts afresh. The
RDB storage runs Optuna's heartbeat: a trial whose worker died (on any host) is failed after the
grace period, and the study still reaches its trial count.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import SpecDecError
from ..paths import cache_dir
from .storage import StorageLock, open_storage, redact

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

WORKER = f"{socket.gethostname()}:{os.getpid()}"  # who ran a trial, in its user attrs

# Trial user attributes that mark a trial as not counted.
# Started after the study was full (lost the race for the last slot; only on a storage without a
# lock): ended as pruned, not counted.
SURPLUS = "surplus"
INTERRUPTED = "interrupted"  # stopped by Ctrl-C


CREATED_BY, TOOL = "created_by", "specdec-tune"


def default_storage() -> str:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{cache / 'studies.db'}"


def study_name_for(key: dict[str, Any]) -> str:
    """Same key -> same study name, so rerunning a command resumes its study."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"specdec-{key.get('target_slug', 'target')}-{digest}"


def on_lost_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Optuna's heartbeat failed `trial`: its worker stopped (killed, out of memory, host gone).
    The trial is not counted, so another one takes its place; the study records the loss where
    `studies show` and optuna-dashboard see it."""
    study.set_user_attr(
        f"lost_trial_{trial.number}",
        {"worker": trial.user_attrs.get("worker"), "params": trial.params, "noticed_by": WORKER},
    )


def open_study(
    name: str,
    storage_url: str,
    sampler: optuna.samplers.BaseSampler,
    heartbeat_s: int | None,
    grace_s: int | None,
    pruner: optuna.pruners.BasePruner | None = None,
) -> Any:
    """Create or load the study on a storage with Optuna's heartbeat; retried because workers
    starting together race on a new database. `pruner`: what `trial.should_prune()` asks
    (search.pruning; None: Optuna's default, which the tuner never asks)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its INFO lines ("A new study created") are not ours
    storage = open_storage(storage_url, heartbeat_s, grace_s, on_lost_trial)
    last: Exception | None = None
    for attempt in range(5):
        try:
            return optuna.create_study(
                study_name=name,
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                direction="maximize",
                load_if_exists=True,
            )
        except Exception as exc:  # a race on the new study's rows
            last = exc
            time.sleep(0.2 * (attempt + 1))
    first = str(last).splitlines()[0] if str(last) else ""
    raise SpecDecError(
        f"cannot open study '{name}' in '{redact(storage_url)}': {type(last).__name__}: {first}"
    ) from None


ENGINE_MODE = "engine_mode"  # study user attr: the mode `auto` resolved to for every worker


def agree_engine_mode(name: str, storage_url: str, resolve: Callable[[], str], wait_s: float) -> str | None:
    """The engine mode every worker of study `name` runs when `auto` was asked for: the first
    worker resolves it (`resolve()`, e.g. timed on its machine) and records it in the study; the
    others take it from there instead of resolving again, so one study never mixes modes.
    Returns the recorded mode, or None when this worker's `resolve()` made it."""
    lock = StorageLock(storage_url, f"{name}:engine")
    try:
        # The first worker holds the lock while it resolves; a hung holder does not stall the
        # others for ever (they resolve for themselves and record nothing over it).
        lock.acquire(timeout_s=wait_s)
        study = open_study(name, storage_url, None, None, None)
        mode = study.user_attrs.get(ENGINE_MODE)
        if isinstance(mode, str):
            return mode
        mode = resolve()
        if lock.held:
            study.set_user_attr(ENGINE_MODE, mode)
            study.set_user_attr(CREATED_BY, TOOL)
        return None
    finally:
        lock.close()


def claim_identity(
    study: optuna.Study, identity: dict[str, Any], seeds: list[dict[str, Any]], where: str
) -> None:
    """The study remembers what it measures; the first worker enqueues the seed configs, and a
    worker with other settings is refused instead of mixing its numbers in."""
    identity = json.loads(json.dumps(identity, default=str))
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        study.set_user_attr(CREATED_BY, TOOL)  # `studies delete --all` deletes only these
        for params in seeds:
            study.enqueue_trial(params, skip_if_exists=True)
        return
    if stored != identity:
        keys = {*stored.get("key", {}), *identity["key"]}
        diff = sorted(k for k in keys if stored.get("key", {}).get(k) != identity["key"].get(k))
        raise SpecDecError(
            f"study '{study.study_name}' in {where} was made with other settings "
            f"({', '.join(diff or ['search space'])}); pass another --study-name or the same settings"
        )


def counted(study: optuna.Study) -> int:
    """Finished trials that count toward the requested number: completed, pruned, or failed with
    an error of their own (not interrupted, not surplus, not lost with a dead worker)."""
    return _counted(study.get_trials(deepcopy=False))


def _counted(trials: list[FrozenTrial]) -> int:
    from optuna.trial import TrialState

    n = 0
    for t in trials:
        if t.user_attrs.get(SURPLUS):
            continue
        failed_here = t.state == TrialState.FAIL and "error" in t.user_attrs
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or failed_here:
            n += 1
    return n


def slot_counts(study: optuna.Study) -> tuple[int, int]:
    """(counted, running) from ONE read of the trials: two reads could miss a trial that finished
    in between (running in neither, finished in neither), and a worker would start a surplus one."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    busy = sum(1 for t in trials if t.state == TrialState.RUNNING)
    return _counted(trials), busy


def running(study: optuna.Study, before: int | None = None) -> int:
    """Trials running now (numbered below `before`, when given)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return sum(1 for t in trials if before is None or t.number < before)


def fail_stale(study: optuna.Study) -> None:
    """Fail the running trials whose worker stopped sending heartbeats."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def fail_interrupted(study: optuna.Study, storage_url: str, number: int | None, first_new: int) -> None:
    """Fail, as interrupted, this worker's trial that a Ctrl-C or SIGTERM left RUNNING. The objective
    marks and fails the trials it catches the interrupt in itself; this is for one caught outside
    it: after Optuna created the trial but before the objective started, or inside Optuna's own write
    of the result (a SIGTERM of `run --workers` left one RUNNING once in a newcomer run of the suite).
    `number`: the trial the objective started, or None; then this worker's trial is the one numbered
    `first_new` or later, as only the holder of the study's slot lock creates trials."""
    import optuna
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    mine = [
        t.number for t in running if (t.number == number if number is not None else t.number >= first_new)
    ]
    if not mine:
        return
    storage = optuna.storages.get_storage(storage_url)
    study_id = storage.get_study_id_from_name(study.study_name)
    for n in mine:
        with contextlib.suppress(Exception):  # finished by a peer meanwhile: nothing to fail
            storage.set_trial_user_attr(
                storage.get_trial_id_from_study_id_trial_number(study_id, n), INTERRUPTED, True
            )
            study.tell(n, state=TrialState.FAIL)


def best_value(study: optuna.Study) -> float | None:
    try:
        return study.best_value
    except ValueError:
        return None
