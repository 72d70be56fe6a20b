"""Measuring's thresholds live in one frozen `MeasurePolicy`, every field documented, and the
functions that decide by them take the policy: a different policy changes their answer, the default
one gives the numbers the module constants gave."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import documented_fields

from specdec_tune.app.reference import process_seconds
from specdec_tune.domain import Noise
from specdec_tune.measure import noise, stats
from specdec_tune.measurepolicy import MEASURE_POLICY, MeasurePolicy


def test_the_policy_is_frozen_and_every_field_has_a_docstring():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MEASURE_POLICY.min_pairs = 3  # type: ignore[misc]
    assert documented_fields(MeasurePolicy) == {f.name for f in dataclasses.fields(MeasurePolicy)}


def test_a_race_resolves_by_the_policys_pairs_and_sign_test():
    a, b = [1.10, 1.12, 1.09, 1.11], [1.0, 1.01, 0.99, 1.0]  # A faster in each of four pairs
    assert not stats.compare(a, b).resolved  # four pairs: the sign test's p = 0.125 > 0.1
    looser = dataclasses.replace(MEASURE_POLICY, min_pairs=4, sign_alpha=0.125)
    c = stats.compare(a, b, policy=looser)
    assert c.resolved and c.a_wins and c.sign_p == pytest.approx(0.125)
    assert stats.compare([*a, 1.1], [*b, 1.0]).resolved  # five unanimous pairs: p = 0.0625


def test_the_search_interval_takes_the_policys_confidence():
    values = [1.2, 1.5, 1.3, 1.9, 1.1, 1.4, 1.6]
    wide = stats.speedup_interval(values)
    narrow = stats.speedup_interval(values, policy=dataclasses.replace(MEASURE_POLICY, confidence=0.5))
    assert wide is not None and narrow is not None
    assert wide[0] <= narrow[0] <= narrow[1] <= wide[1] and narrow != wide


def test_repeats_needed_resolve_the_policys_share():
    assert noise.repeats_needed(0.02) == 5  # ceil((2 x 1.96 x sqrt(2) x 0.02 / 0.05)^2)
    finer = dataclasses.replace(MEASURE_POLICY, resolve_share=0.025)
    assert noise.repeats_needed(0.02, policy=finer) == 20
    assert noise.repeats_needed(0.02, 0.025) == 20  # an explicit share wins over the policy's


def test_the_noisy_machine_line_names_the_policys_share():
    n = Noise(plain_pass_s=1.0, plain_pass_cv=0.04, plain_passes=3, cpus=2, repeats_needed=20)
    assert "resolving 5% needs about 20" in noise.noise_line(n, 4)
    coarser = dataclasses.replace(MEASURE_POLICY, resolve_share=0.10)
    assert "resolving 10% needs" in noise.noise_line(n, 4, coarser)


def test_a_reference_process_is_estimated_from_the_policy():
    # 5 s start-up, then (3 repeats + warm-up) x a plain pass x (1 + 0.5 speculative + 0.4 anchor)
    assert process_seconds(1.0) == pytest.approx(5.0 + 4 * 1.9)
    quick = dataclasses.replace(MEASURE_POLICY, reference_startup_s=1.0, reference_repeats=1)
    assert process_seconds(1.0, policy=quick) == pytest.approx(1.0 + 2 * 1.9)


def test_the_matmul_anchor_is_sized_per_device():
    assert MEASURE_POLICY.anchor_matmul_n("cpu") == 512
    assert MEASURE_POLICY.anchor_matmul_n("cuda:0") == 2048
