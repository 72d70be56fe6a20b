"""`run --final-repeats N` is a hard cap: no finalist is measured more than N interleaved repeats in
the final round, whatever racing (search.racing) or the machine's noise (app.common.adapt_to_noise)
would add. Without the option the round races as designed: more repeats until the winner is
resolved."""

from __future__ import annotations

import optuna
import pytest
from helpers import invoke

from specdec_tune.app.common import adapt_to_noise
from specdec_tune.domain import Config, DraftSpec, Metrics, Noise, Result
from specdec_tune.search.final import final_round
from specdec_tune.search.results import TuneResult
from specdec_tune.search.space import TuneSettings
from specdec_tune.store.yamlio import load_profile

LOOKUP = DraftSpec(name="lookup", kind="prompt_lookup", ngram_min=1, ngram_max=3)
NOISY = Noise(plain_pass_s=1.0, plain_pass_cv=0.04, plain_passes=3, cpus=2, repeats_needed=20)


class StubStudy:
    """What final_round asks of an Optuna study: its user attributes."""

    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def set_user_attr(self, key: str, value: object) -> None:
        self.user_attrs[key] = value


class TiedBackend:
    """Every finalist measures the same speedup: the race can never resolve, so only a cap stops it.
    Records the repeats each config was measured for."""

    def __init__(self) -> None:
        self.repeats: dict[tuple, int] = {}

    def measure(self, configs, case, batch_size=1, repeats=3, seed=0):
        from specdec_tune.measurement import Measurement

        out = []
        for c in configs:
            self.repeats[c.key] = self.repeats.get(c.key, 0) + repeats
            speedups = [1.3 * (1 + 0.02 * ((r % 3) - 1)) for r in range(repeats)]
            m = Metrics(130.0, 100.0, 1.3, 0.02, 0.7, 2.0, repeats=repeats)
            out.append(Measurement(m, tokens=0, mismatches=0, speedups=speedups))
        return out


def _searched() -> TuneResult:
    results = [
        Result(Config(LOOKUP, g), Metrics(130.0, 100.0, 1.3 - 0.01 * g, 0.02, 0.7, 2.0)) for g in (2, 3)
    ]
    results.append(Result(Config(LOOKUP, 0), Metrics(100.0, 100.0, 1.0, 0.0, 0.0, 1.0)))
    return TuneResult(results, results[-1].metrics, "s", "mem", 3, 0, 0, {})


def _race(settings: TuneSettings) -> tuple[TiedBackend, TuneResult]:
    backend, result = TiedBackend(), _searched()
    final_round(StubStudy(), result, backend, None, settings)
    return backend, result


@pytest.mark.parametrize("cap", [1, 3, 7])
def test_the_cap_bounds_every_finalists_repeats_in_a_race_that_never_resolves(cap):
    backend, result = _race(TuneSettings(finalists=2, final_repeats_cap=cap))
    assert len(backend.repeats) == 2 and max(backend.repeats.values()) <= cap
    assert result.final_repeats <= cap and result.final_verdict == "tie within noise"
    # the cap is a ceiling, not a target of one: a first pass of min(cap, 5), racing to the cap
    assert max(backend.repeats.values()) >= min(cap, 5)


def test_without_the_cap_the_same_race_adds_repeats_until_its_ceiling():
    """The control: the race above does go past 7 repeats when nothing caps it."""
    backend, _ = _race(TuneSettings(finalists=2))
    assert max(backend.repeats.values()) > 7


def test_the_noise_cannot_raise_a_capped_final_round():
    capped = TuneSettings(finalists=2, final_repeats_cap=2)
    raised, _ = adapt_to_noise(capped, NOISY)
    assert raised.final_repeats <= 2 and raised.final_max_repeats == 2
    backend, _ = _race(raised)
    assert max(backend.repeats.values()) <= 2
    # uncapped, the same noise raises the race's ceiling (the design: more repeats where noisy)
    free, _ = adapt_to_noise(TuneSettings(finalists=2), NOISY)
    assert free.final_max_repeats == 20


@pytest.mark.slow  # the CLI end to end (scripted engine, no model)
def test_run_final_repeats_1_measures_no_finalist_twice(tmp_path, fake_engine):
    out, storage = tmp_path / "fake.yaml", f"sqlite:///{tmp_path / 's.db'}"
    r = invoke(
        "run", "--backend", "fake", "--workload", "demo-code", "--prompts", "4", "--trials", "6",
        "--finalists", "2", "--final-repeats", "1", "--storage", storage, "--study-name", "cap",
        "--out", str(out), "--reference-processes", "0",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    stored = optuna.load_study(study_name="cap", storage=storage).user_attrs["final_round"]
    # the finalists and the engine's pinned default each got one repeat, and no racing round
    assert len(stored["metrics"]) >= 2
    assert all(m["repeats"] == 1 and len(m["speedup_samples"]) == 1 for m in stored["metrics"])
    assert stored["rounds"] == 1
    assert load_profile(out).search.final_repeats == 1
