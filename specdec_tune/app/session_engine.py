"""What an engine's own cost model and defaults add to one session's search (app.session_search):
the model's best predictions enqueued after the probe trials, its view at a later batch size, and
in the profile the defaults as raced and the model's out-of-sample fit."""

from __future__ import annotations

import statistics
from typing import Any

from ..backends.protocols import MeasuringSession
from ..domain import FIXED_GAMMA, Config, Costs, DraftSpec
from ..search.costmodel import CostModel
from ..search.enginepredictor import BatchedPredictor, Predictor
from ..search.results import TuneResult, prediction_errors
from ..search.space import TuneSettings, seed_configs
from .common import trial_params


def predicted_best(result: TuneResult) -> float | None:
    """The prediction its best config had before it was measured (the tuner's predictor or the
    closed-form model), None when nothing predicted it."""
    predicted = result.results[0].metrics.predicted_speedup
    return round(predicted, 4) if predicted else None


def default_rows(result: TuneResult, defaults: list[Config]) -> list[dict[str, Any]]:
    """The engine's defaults as measured in the final round, each with its speedup, interval and
    the flags that ran it."""
    keys = {c.key for c in defaults}
    rows = []
    for r in result.results:
        if r.config.key in keys:
            m = r.metrics
            rows.append({
                "config": r.config.label, "speedup": round(m.speedup, 4),
                "interval": [round(x, 4) for x in m.speedup_interval or []],
                "tokens_per_s": round(m.tokens_per_s, 3), "acceptance_rate": round(m.acceptance_rate, 4),
                "flags": list(r.backend_args),
            })  # fmt: skip
    return rows


PREDICTED_SEEDS = 4  # the engine model's best configs tried right after the first trials


def enqueue_predictions(
    result: TuneResult,
    s: MeasuringSession,
    costs: Costs | None,
    settings: TuneSettings,
    predictor: Predictor | None = None,
) -> None:
    """The study's next trials: the engine cost model's best predictions over the whole space
    (fitted from the first trials' decode timings), else the closed-form model's (fed with the
    engine's costs and measured acceptance, and the workload's per-request budgets)."""
    import optuna

    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    ranked = predictor.rank(space_configs(s.specs, settings.max_gamma)) if predictor is not None else []
    if ranked:
        seeds = [trial_params(c) for c, _ in ranked[:PREDICTED_SEEDS]]
    else:
        seeds = seed_configs(s.specs, CostModel(costs, s.case.max_new_tokens), settings)[1:]
    for params in seeds:
        study.enqueue_trial(params, skip_if_exists=True)


def space_configs(specs: list[DraftSpec], max_gamma: int) -> list[Config]:
    """Every (draft, gamma) of the space at threshold 0 (a draft of fixed length: its one gamma)."""
    out = []
    for d in specs:
        gammas = [FIXED_GAMMA[d.kind]] if d.kind in FIXED_GAMMA else range(1, max_gamma + 1)
        out += [Config(d, g, 0.0) for g in gammas]
    return out


def cost_model_fit(result: TuneResult, predictor: Predictor) -> dict[str, Any]:
    """The engine cost model against what was measured: each trial predicted before it ran (out of
    sample), median and worst relative error, and its reason for the best config of each draft."""
    errs = prediction_errors(result)
    best: dict[str, Any] = {}
    for r in result.results:
        if r.config.gamma > 0:
            best.setdefault(r.config.draft.name, r.config)
    out: dict[str, Any] = {"configs": len(errs)}
    if errs:
        out |= {"median_error": round(statistics.median(e for e, _ in errs), 4), "worst_error": round(errs[-1][0], 4),
                "worst_config": errs[-1][1]}  # fmt: skip
    out["reason"] = predictor.explain(result.results[0].config) if result.results[0].config.gamma else ""
    out["per_draft"] = {name: predictor.explain(c) for name, c in best.items()}
    return out


def batched(
    predictor: Predictor | None, batch_size: int, costs: Costs | None = None
) -> BatchedPredictor | None:
    """The B = 1 engine predictor's view at a later batch size (search.enginepredictor.
    BatchedPredictor, with the engine's C_ver at that size where `costs` hold it), or None where
    there is none."""
    return BatchedPredictor(predictor, batch_size, costs) if predictor is not None else None
