"""A finished search as data: every trial as a row (from `study.trials_dataframe()`), and the
measured configs ranked, one `Result` per distinct config, judged by its median trial.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..domain import Config, DraftSpec, Metrics, Result
from ..errors import SpecDecError
from .space import config_of_params
from .study import SURPLUS

if TYPE_CHECKING:
    import optuna

# The trials CSV: these columns first, then the metrics below.
CSV_HEAD = ("number", "state", "draft", "gamma", "threshold", "speedup")
CSV_ATTRS = (
    "tokens_per_s",
    "baseline_tokens_per_s",
    "acceptance_rate",
    "mean_accepted_len",
    "predicted_speedup",
    "duration_s",
    "error",
)


@dataclass
class TuneResult:
    results: list[Result]  # completed configs, best first (the baseline included as gamma 0)
    baseline: Metrics
    study_name: str
    storage: str
    trials: int
    failed: int
    pruned: int
    space: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per trial, for the CSV
    finalists: int = 0  # configs the final round re-measured (0: no final round ran)
    final_note: str = ""  # why the final round did not run, when it was asked for and did not
    final_verdict: str = ""  # racing.RESOLVED or racing.TIE ("" : no final round)
    final_margin: list[float] = field(default_factory=list)  # best / runner-up: ratio, lo, hi
    final_tied: list[str] = field(default_factory=list)  # on a tie: configs not told apart, simplest first
    final_repeats: int = 0  # the most interleaved repeats a finalist got (racing adds rounds)
    outliers: list[str] = field(default_factory=list)  # search trials not believed (final.is_outlier)
    # This worker's trials that a peer failed while it was paused: their results were dropped.
    lost: list[int] = field(default_factory=list)
    # Not searched: the cell whose top configs raced head to head here instead ("B=1", "L=256").
    confirmed_from: str | None = None


def csv_row(number: int | None, state: str, config: Config, speedup: float | None, attrs: dict) -> dict:
    """One row of the trials CSV: a search trial (attrs: its user attrs) or a finalist (its metrics)."""
    c = config
    head = dict(zip(CSV_HEAD, (number, state, c.draft.name, c.gamma, c.threshold, speedup), strict=True))
    return {**head, **{k: attrs.get(k) for k in CSV_ATTRS}, "gamma_policy": c.gamma_policy}


def _present(value: Any) -> bool:
    return not (value is None or (isinstance(value, float) and math.isnan(value)))


def trial_records(study: optuna.Study) -> list[dict[str, Any]]:
    """Every trial as {number, state, value, params, attrs}, from `study.trials_dataframe()`."""
    df = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs"))
    records = []
    for row in df.to_dict("records"):
        params = {k[7:]: v for k, v in row.items() if k.startswith("params_") and _present(v)}
        attrs = {k[11:]: v for k, v in row.items() if k.startswith("user_attrs_") and _present(v)}
        value = row.get("value")
        records.append(
            {
                "number": int(row["number"]),
                "state": str(row["state"]),
                "value": float(value) if _present(value) else None,
                "params": params,
                "attrs": attrs,
            }
        )
    return records


def summarise(
    study: optuna.Study, specs: list[DraftSpec], name: str, storage: str, space: dict[str, Any]
) -> TuneResult:
    """Finished trials -> Results (best first, one per distinct config), baseline, trial rows."""
    by_name = {s.name: s for s in specs}
    rows: list[dict[str, Any]] = []
    groups: dict[tuple[str, int, float], list[tuple[Config, dict[str, Any]]]] = {}
    failed = pruned = 0
    base_rates = []
    for rec in trial_records(study):
        attrs, state = rec["attrs"], rec["state"]
        if attrs.get(SURPLUS) or state in ("RUNNING", "WAITING"):
            continue
        config = config_of_params(rec["params"], by_name)
        if config is None:
            continue
        rows.append(csv_row(rec["number"], state, config, rec["value"], attrs))
        if state == "FAIL":
            failed += "error" in attrs
        elif state == "PRUNED":
            pruned += 1
        elif state == "COMPLETE":
            if not attrs.get("reused_baseline"):
                base_rates.append(attrs["baseline_tokens_per_s"])
            groups.setdefault(config.key, []).append((config, {**attrs, "speedup": rec["value"]}))
    # A config the sampler tried more than once is judged by its median trial, not its luckiest:
    # picking the maximum of noisy repeats would overstate the winner.
    results = []
    for trials in groups.values():
        trials.sort(key=lambda ct: ct[1]["speedup"])
        config, attrs = trials[(len(trials) - 1) // 2]
        metrics = Metrics.from_dict(attrs)
        if config.gamma == 0:
            metrics.speedup = 1.0
        results.append(Result(config, metrics))
    results.sort(key=lambda r: -r.metrics.speedup)
    if not results:
        reasons = sorted({r["error"] for r in rows if r.get("error")})
        raise SpecDecError(
            "no trial finished, so there is no profile to write"
            + (f"; trials failed with: {'; '.join(reasons[:3])}" if reasons else "")
        )
    rate = statistics.median(base_rates) if base_rates else results[0].metrics.baseline_tokens_per_s
    baseline = Metrics(
        tokens_per_s=rate,
        baseline_tokens_per_s=rate,
        speedup=1.0,
        speedup_spread=0.0,
        acceptance_rate=0.0,
        mean_accepted_len=1.0,
        repeats=results[0].metrics.repeats,
        predicted_speedup=1.0,
    )
    return TuneResult(
        results=results,
        baseline=baseline,
        study_name=name,
        storage=storage,
        trials=len([r for r in rows if r["state"] != "FAIL" or r.get("error")]),
        failed=failed,
        pruned=pruned,
        space=space,
        rows=rows,
    )


def prediction_errors(result: TuneResult) -> list[tuple[float, str]]:
    """(|predicted - measured| / measured, config label) over the configs the cost model predicted,
    smallest first."""
    return sorted(
        (abs(r.metrics.predicted_speedup - r.metrics.speedup) / r.metrics.speedup, r.config.label)
        for r in result.results
        if r.config.gamma > 0 and r.metrics.predicted_speedup and r.metrics.speedup > 0
    )


def prediction_error(result: TuneResult) -> float | None:
    """Median relative error over the configs the cost model predicted (`prediction_errors`)."""
    errs = prediction_errors(result)
    return round(statistics.median(e for e, _ in errs), 4) if errs else None
