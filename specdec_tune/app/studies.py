"""`studies list|show|delete`: the Optuna studies in a storage, as data (the default SQLite cache
keeps every study ever run until it is pruned)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import SpecDecError
from ..search.storage import open_storage, redact
from ..search.study import CREATED_BY, TOOL, default_storage


def _storage(url: str | None) -> tuple[Any, str]:
    """Open an existing storage; `studies` never creates one (a typo must not make a new database)."""
    url = url or default_storage()
    _require_existing(url)
    return open_storage(url), url


def _require_existing(url: str) -> None:
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:
        return  # open_storage says why it is not a URL
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return
    if u.database.startswith("file:"):
        raise SpecDecError(f"--storage '{redact(url)}': give the SQLite file as sqlite:///PATH")
    if not Path(u.database).expanduser().is_file():
        raise SpecDecError(
            f"no study storage at {redact(url)}: the file does not exist (a typo?); `studies` never "
            "creates one, `specdec-tune run` does"
        )


def _state_counts(trials: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def list_studies(storage: str | None = None) -> list[dict[str, Any]]:
    """One row per study: name, trials by state, best speedup, when it started."""
    import optuna

    store, _ = _storage(storage)
    rows = []
    for s in optuna.get_all_study_summaries(store, include_best_trial=True):
        study_id = store.get_study_id_from_name(s.study_name)
        trials = store.get_all_trials(study_id, deepcopy=False)
        rows.append(
            {
                "name": s.study_name,
                "trials": _state_counts(trials),
                "best": s.best_trial.value if s.best_trial is not None else None,
                "started": s.datetime_start.isoformat(timespec="seconds") if s.datetime_start else None,
            }
        )
    return rows


def _load(name: str, storage: str | None) -> Any:
    import optuna

    store, url = _storage(storage)
    try:
        return optuna.load_study(study_name=name, storage=store)
    except KeyError:
        raise SpecDecError(
            f"no study '{name}' in {redact(url)}; `specdec-tune studies list` shows them"
        ) from None


def show_study(name: str, storage: str | None = None) -> dict[str, Any]:
    """A study as its tools see it: settings, trial counts, final round, lost trials, every trial."""
    study = _load(name, storage)
    attrs = study.user_attrs
    trials = study.get_trials(deepcopy=False)
    final = attrs.get("final_round") or {}
    return {
        "name": name,
        "trials": _state_counts(trials),
        "key": (attrs.get("identity") or {}).get("key", {}),
        "final_round": {k: final[k] for k in ("worker", "error") if k in final}
        | ({"configs": final["key"]["configs"]} if "key" in final else {}),
        "lost": [v for k, v in sorted(attrs.items()) if k.startswith("lost_trial_")],
        "rows": [
            {
                "number": t.number,
                "state": t.state.name,
                **t.params,
                "speedup": t.value,
                "worker": t.user_attrs.get("worker"),
                "error": t.user_attrs.get("error"),
            }
            for t in trials
        ],
    }


def delete_studies(
    names: list[str],
    storage: str | None = None,
    everything: bool = False,
    force: bool = False,
) -> list[str]:
    """Delete the named studies, or with `everything` every study specdec-tune created (a study of
    another tool in the same storage is left alone). Unknown names, and studies with running trials
    unless `force`, are refused before any is deleted. The CLI asks for --yes first."""
    import optuna

    if everything and names:
        raise SpecDecError("give study names or --all, not both")
    if not everything and not names:
        raise SpecDecError("name the studies to delete, or pass --all")
    store, url = _storage(storage)
    summaries = optuna.get_all_study_summaries(store, include_best_trial=False)
    known = [s.study_name for s in summaries]
    if everything:
        names = [s.study_name for s in summaries if is_ours(s.user_attrs)]
    missing = [n for n in names if n not in known]
    if missing:
        raise SpecDecError(f"no study {', '.join(map(repr, missing))} in {redact(url)}")
    if not force:
        busy = [n for n in names if _running(store, n)]
        if busy:
            raise SpecDecError(
                f"study {', '.join(map(repr, busy))} has running trials (a worker may still be using it); "
                "stop its workers first, or pass --force"
            )
    for n in names:
        optuna.delete_study(study_name=n, storage=store)
    return names


def is_ours(user_attrs: dict[str, Any]) -> bool:
    """Whether specdec-tune created the study: its marker, or (studies made before the marker) the
    identity every specdec-tune study records."""
    identity = user_attrs.get("identity")
    return user_attrs.get(CREATED_BY) == TOOL or (isinstance(identity, dict) and "key" in identity)


def _running(store: Any, name: str) -> bool:
    import optuna

    study_id = store.get_study_id_from_name(name)
    running = store.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return bool(running)
