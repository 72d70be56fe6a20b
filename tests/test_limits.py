"""The allowed ranges are defined once: the engine, the search settings, the CLI and the profile
schema accept and refuse exactly the same values."""

from __future__ import annotations

import pytest
from helpers import make_sample_profile

from specdec_tune.errors import SpecDecError
from specdec_tune.limits import MAX_GAMMA, check_decoding, check_gamma, check_threshold
from specdec_tune.search.space import TuneSettings
from specdec_tune.store.validate import profile_from_dict
from specdec_tune.store.yamlio import profile_to_dict


def _schema_accepts(threshold: float = 0.0, gamma: int = 4) -> bool:
    data = profile_to_dict(make_sample_profile(kind="model", gamma=4, threshold=0.0))
    data["best"]["config"]["threshold"] = threshold
    data["best"]["config"]["gamma"] = gamma
    try:
        profile_from_dict(data)
    except SpecDecError:
        return False
    return True


def _engine_accepts(threshold: float = 0.0, gamma: int = 4) -> bool:
    try:
        check_decoding(gamma, threshold, 0.0, 8)
    except SpecDecError:
        return False
    return True


@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.95, 0.999, 1.0, -0.01, 1.5])
def test_threshold_range_is_the_same_for_engine_and_schema(threshold):
    assert _engine_accepts(threshold=threshold) == _schema_accepts(threshold=threshold)
    assert _engine_accepts(threshold=threshold) == (0.0 <= threshold < 1.0)


@pytest.mark.parametrize("gamma", [1, MAX_GAMMA, MAX_GAMMA + 1])
def test_gamma_limit_is_the_same_for_engine_and_schema_and_search(gamma):
    ok = gamma <= MAX_GAMMA
    assert _engine_accepts(gamma=gamma) == ok
    assert _schema_accepts(gamma=gamma) == ok
    if ok:
        TuneSettings(max_gamma=gamma)
    else:
        with pytest.raises(SpecDecError, match=str(MAX_GAMMA)):
            TuneSettings(max_gamma=gamma)


def test_checks_refuse_bools_and_floats_as_counts():
    with pytest.raises(SpecDecError):
        check_gamma(True)
    with pytest.raises(SpecDecError):
        check_gamma(2.0)
    with pytest.raises(SpecDecError, match=r"\[0, 1\)"):
        check_threshold(1.0)
    with pytest.raises(SpecDecError, match="--trials"):
        TuneSettings(trials=0)
