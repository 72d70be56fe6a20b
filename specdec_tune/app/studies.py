"""`studies list|show|delete`: the Optuna studies in a storage, as data (the default SQLite cache
keeps every study ever run until it is pruned)."""

from __future__ import annotations

from typing import Any

from ..errors import SpecDecError


def _storage(url: str | None) -> tuple[Any, str]:
    from ..search.storage import open_storage
    from ..search.study import default_storage

    url = url or default_storage()
    return open_storage(url), url


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

    from ..search.storage import redact

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


def delete_studies(names: list[str], storage: str | None = None, everything: bool = False) -> list[str]:
    """Delete the named studies (or all of them); unknown names are refused before any is deleted."""
    import optuna

    from ..search.storage import redact

    store, url = _storage(storage)
    known = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    if everything:
        names = known
    elif not names:
        raise SpecDecError("name the studies to delete, or pass --all")
    missing = [n for n in names if n not in known]
    if missing:
        raise SpecDecError(f"no study {', '.join(map(repr, missing))} in {redact(url)}")
    for n in names:
        optuna.delete_study(study_name=n, storage=store)
    return names
