"""The Optuna study behind a search: where it is stored, what it is called, who may join it, and
how many of its trials count. Public Optuna API only.

A study is named after everything that changes the answer (tool version, hardware, target,
workload, budget, space), so rerunning a command resumes it and an upgrade starts afresh. The
RDB storage runs Optuna's heartbeat: a trial whose worker died (on any host) is failed after the
grace period, and the study still reaches its trial count.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from ..errors import SpecDecError

# Trial user attributes that mark a trial as not counted.
SURPLUS = "surplus"  # started after the study was already full (lost a race with another worker)
INTERRUPTED = "interrupted"  # stopped by Ctrl-C


def default_storage() -> str:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec-tune"
    cache.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{cache / 'studies.db'}"


def study_name_for(key: dict[str, Any]) -> str:
    """Same key -> same study name, so rerunning a command resumes its study."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"specdec-{key.get('target_slug', 'target')}-{digest}"


def redact(url: str) -> str:
    """Never write or print a database password."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


def open_study(name: str, storage_url: str, sampler: Any, heartbeat_s: int, grace_s: int) -> Any:
    """Create or load the study; retried because workers starting together race on a new database."""
    import optuna

    last: Exception | None = None
    for attempt in range(5):
        try:
            kwargs: dict[str, Any] = {}
            if storage_url.startswith("sqlite"):
                # Wait for another process's write lock instead of failing at once.
                kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
            storage = optuna.storages.RDBStorage(
                storage_url, heartbeat_interval=heartbeat_s, grace_period=grace_s, **kwargs
            )
            return optuna.create_study(
                study_name=name, storage=storage, sampler=sampler, direction="maximize", load_if_exists=True
            )
        except (ImportError, ValueError) as exc:
            last = exc
            break
        except Exception as exc:  # sqlalchemy: a schema race, a bad URL, an unreachable server
            last = exc
            time.sleep(0.2 * (attempt + 1))
    first = str(last).splitlines()[0] if str(last) else ""
    raise SpecDecError(
        f"cannot open Optuna storage '{redact(storage_url)}': {type(last).__name__}: {first}"
    ) from None


def claim_identity(study: Any, identity: dict[str, Any], seeds: list[dict[str, Any]], where: str) -> None:
    """The study remembers what it measures; the first worker enqueues the seed configs, and a
    worker with other settings is refused instead of mixing its numbers in."""
    identity = json.loads(json.dumps(identity, default=str))
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
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


def counted(study: Any) -> int:
    """Finished trials that count toward the requested number: completed, pruned, or failed with
    an error of their own (not interrupted, not surplus, not lost with a dead worker)."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False):
        failed_here = t.state == TrialState.FAIL and "error" in t.user_attrs
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or failed_here:
            n += 1
    return n


def running(study: Any, before: int | None = None) -> int:
    """Trials running now (numbered below `before`, when given)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return sum(1 for t in trials if before is None or t.number < before)


def fail_stale(study: Any) -> None:
    """Fail the running trials whose worker stopped sending heartbeats."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def best_value(study: Any) -> float | None:
    try:
        return study.best_value
    except ValueError:
        return None
