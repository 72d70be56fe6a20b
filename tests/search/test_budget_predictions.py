"""The tuner's cost model counts the workload's per-request token budgets: a config's `pred.` is
lower when the requests are short (the last steps of each request draft less)."""

from __future__ import annotations

import pytest
from helpers import make_costs

from specdec_tune.domain import DraftSpec, Metrics
from specdec_tune.measurement import Measurement
from specdec_tune.runtime.workloads import Case
from specdec_tune.search.costmodel import CostModel
from specdec_tune.search.space import TuneSettings
from specdec_tune.search.tuner import tune

DRAFT = "llama-3.2-1b"  # a draft of make_costs(); a lookup kind keeps the grid free of thresholds


class FixedBackend:
    """Every config measures 1.5x: only the predictions differ between the two studies."""

    name = "fixed"
    screens = False

    def info(self):
        return {"name": self.name}

    def measure(self, configs, case, batch_size=1, repeats=3, seed=0, on_repeat=None):
        metrics = Metrics(150.0, 100.0, 1.5, 0.01, 0.5, 2.0, [0.6, 0.4], repeats)
        return [Measurement(metrics, tokens=10, mismatches=0, speedups=[1.5] * repeats) for _ in configs]


def _predicted(budgets: list[int], tmp_path) -> dict[int, float]:
    settings = TuneSettings(
        trials=4,
        storage=f"sqlite:///{tmp_path / f'b{budgets[0]}.db'}",
        study_name="budgets",
        repeats=1,
        max_gamma=3,
        finalists=0,
        sampler="grid",
    )
    case = Case([[1, 2, 3]] * len(budgets), budgets, [], 0.0)
    spec = DraftSpec(DRAFT, "prompt_lookup", ngram_min=1, ngram_max=3)
    res = tune(FixedBackend(), [spec], case, settings, make_costs())
    return {r.config.gamma: r.metrics.predicted_speedup for r in res.results if r.config.gamma > 0}


@pytest.mark.slow  # tunes in process
def test_short_budgets_lower_the_tuners_predictions(tmp_path):
    long = _predicted([400, 400, 400], tmp_path)
    short = _predicted([4, 3, 5], tmp_path)
    assert set(long) == set(short) == {1, 2, 3}
    unbudgeted = CostModel(make_costs())  # what the tuner predicted before it knew the budgets
    for g in (1, 2, 3):
        assert short[g] < 0.98 * long[g]
        assert long[g] == pytest.approx(unbudgeted.predict(DRAFT, g), rel=0.02)  # long: a small cut
