"""Interleaved timing of one or several configs against the plain target."""

from __future__ import annotations

import pytest

from specdec_tune.errors import SpecDecError
from specdec_tune.measure import bench as measure_mod
from specdec_tune.measure.bench import Entry, measure, measure_many
from specdec_tune.runtime.decode import SpecStats
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.workloads import Case


def case(prompts, n=3, max_new=10):
    return Case(prompts[:n], [max_new] * n, [], 0.0)


def test_passes_are_interleaved_and_reversed_on_odd_repeats(monkeypatch, tiny_target, prompts):
    order = []

    def fake_pass(target, drafter, gamma, threshold, c, seed=0, ctx=None):
        order.append((gamma, len(c.prompts)))
        return [[1, 2, 3]] * len(c.prompts), SpecStats()

    monkeypatch.setattr(measure_mod, "run_pass", fake_pass)
    d = object()  # any drafter: run_pass is faked
    entries = [Entry(d, 1), Entry(None, 0), Entry(d, 2)]
    ms = measure_many(tiny_target, entries, case(prompts), repeats=3)
    warm, timed = order[:3], order[3:]
    assert warm == [(0, 1), (1, 1), (2, 1)]  # one warm-up on one prompt, plain entry not repeated
    # The plain entry shares the baseline pass; the order reverses every other repeat (ABBA).
    assert [g for g, _ in timed] == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert all(n == 3 for _, n in timed)
    assert ms[1].metrics.speedup == 1.0 and ms[1].speedups == [1.0, 1.0, 1.0]
    assert all(len(m.speedups) == 3 and m.metrics.repeats == 3 for m in ms)


def test_measure_many_on_real_drafters_is_exact_and_counts_acceptance(tiny_target, tiny_draft, prompts):
    c = case(prompts)
    ms = measure_many(
        tiny_target,
        [Entry(ModelDrafter(tiny_draft), 3), Entry(PromptLookupDrafter(1, 3), 2), Entry(None, 0)],
        c,
        repeats=2,
    )
    model, lookup, plain = ms
    assert all(m.mismatches == 0 for m in ms)  # greedy: token for token the target's output
    assert model.outputs == lookup.outputs == plain.outputs
    assert model.stats.proposed > 0 and 0 < model.metrics.acceptance_rate <= 1
    assert (
        model.metrics.mean_accepted_len > 1
        and plain.metrics.mean_accepted_len == 1.0
        and plain.metrics.acceptance_rate == 0
    )
    # Every config saw the same baseline passes.
    assert (
        model.metrics.baseline_tokens_per_s
        == lookup.metrics.baseline_tokens_per_s
        == plain.metrics.baseline_tokens_per_s
    )
    # One config alone measures the same tokens and acceptance as inside a group.
    alone = measure(tiny_target, ModelDrafter(tiny_draft), 3, 0.0, c, repeats=2)
    assert alone.outputs == model.outputs and alone.metrics.acceptance_rate == model.metrics.acceptance_rate


def test_on_repeat_sees_running_medians_and_may_stop(tiny_target, tiny_draft, prompts):
    seen = []

    class Stop(Exception):
        pass

    def hook(r, medians):
        seen.append((r, medians))
        if r == 1:
            raise Stop

    with pytest.raises(Stop):
        measure_many(tiny_target, [Entry(ModelDrafter(tiny_draft), 2)], case(prompts, 1), 4, on_repeat=hook)
    assert [r for r, _ in seen] == [0, 1] and all(len(m) == 1 and m[0] > 0 for _, m in seen)


def test_bad_arguments_are_user_errors(tiny_target, prompts):
    with pytest.raises(SpecDecError):
        measure_many(tiny_target, [Entry(None, 0)], case(prompts), repeats=0)
    with pytest.raises(SpecDecError):
        measure_many(tiny_target, [Entry(None, 1, threshold=1.5)], case(prompts), repeats=1)
    with pytest.raises(ValueError):
        measure_many(tiny_target, [], case(prompts))
