"""Interleaved timing of one or several configs against the plain target."""

from __future__ import annotations

import pytest

from specdec_tune.domain import DraftSpec
from specdec_tune.errors import SpecDecError
from specdec_tune.measure import bench as measure_mod
from specdec_tune.measure.batched import measure_batched
from specdec_tune.measure.bench import Entry, measure, measure_many
from specdec_tune.runtime.decode import SpecStats
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.drafting.hybrid import HybridDrafter
from specdec_tune.runtime.workloads import Case


def case(prompts, n=3, max_new=10):
    return Case(prompts[:n], [max_new] * n, [], 0.0)


def test_passes_alternate_prompt_by_prompt_reversing_every_other_prompt(monkeypatch, tiny_target, prompts):
    warm, timed = [], []

    def fake_pass(target, drafter, gamma, threshold, c, seed=0, ctx=None):
        warm.append((gamma, len(c.prompts)))
        return [[1, 2, 3]] * len(c.prompts), SpecStats()

    def fake_prompt(target, drafter, gamma, threshold, c, i, generator=None, ctx=None):
        timed.append((gamma, i))
        return [1, 2, 3], SpecStats()

    monkeypatch.setattr(measure_mod, "run_pass", fake_pass)
    monkeypatch.setattr(measure_mod, "run_prompt", fake_prompt)
    d = object()  # any drafter: the passes are faked
    entries = [Entry(d, 1), Entry(None, 0), Entry(d, 2)]
    c = case(prompts)
    ms = measure_many(tiny_target, entries, c, repeats=3)
    assert warm == [(0, 1), (1, 1), (2, 1)]  # one warm-up on one prompt, plain entry not repeated
    # The plain entry shares the baseline; the contenders take turns prompt by prompt, the order
    # reversed at every other prompt (ABBA at the prompt level), every prompt of every repeat once.
    n = len(c.prompts)
    assert n > 1 and len(timed) == 3 * n * 3
    for turn in range(3 * n):
        part = timed[3 * turn : 3 * turn + 3]
        assert [g for g, _ in part] == ([0, 1, 2] if turn % 2 == 0 else [2, 1, 0])
        assert {i for _, i in part} == {turn % n}
    assert ms[1].metrics.speedup == 1.0 and ms[1].speedups == [1.0, 1.0, 1.0]
    assert all(len(m.speedups) == 3 and m.metrics.repeats == 3 for m in ms)
    assert ms[0].outputs == [[1, 2, 3]] * n  # a repeat's outputs, prompt by prompt


def test_a_burst_hits_every_contender_of_a_prompt_alike():
    """Load that switches on and off over a few parts: timed whole pass by whole pass, the burst
    lands on one contender only; part by part, both see it and their ratio stays near the truth."""
    import itertools

    from specdec_tune.measure import timing

    clock = itertools.count()
    now = {"t": 0.0}

    def work(cost: float):
        def run(*_):
            tick = next(clock)
            slow = 3.0 if (tick // 8) % 2 == 1 else 1.0  # the load: on for 8 calls, off for 8
            now["t"] += cost * slow
            return None

        return run

    real = timing.time.perf_counter
    timing.time.perf_counter = lambda: now["t"]
    try:
        parts = timing.interleaved_parts({"a": work(1.0), "b": work(2.0)}, 4, 8, "cpu")
        clock = itertools.count()
        whole = timing.interleaved(
            {"a": lambda r: [work(1.0)() for _ in range(8)], "b": lambda r: [work(2.0)() for _ in range(8)]},
            4,
            "cpu",
        )
    finally:
        timing.time.perf_counter = real
    ratio_parts = [b[0] / a[0] for a, b in zip(parts["a"], parts["b"], strict=True)]
    ratio_whole = [b[0] / a[0] for a, b in zip(whole["a"], whole["b"], strict=True)]
    assert all(abs(x - 2.0) < 0.35 for x in ratio_parts)  # the true ratio is 2
    assert max(abs(x - 2.0) for x in ratio_whole) > 1.0  # a pass in the burst, the other out of it


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


def _counted(m, gamma: int, requests: int) -> bool:
    """Do m's per-source counts cover its own timed passes? A hybrid counts committed steps, so
    each request's last step (up to gamma tokens) is missing, and nothing more or less."""
    counted = sum(s["proposed"] for s in m.metrics.per_source.values())
    return m.stats.proposed - gamma * requests <= counted <= m.stats.proposed


def test_configs_sharing_one_hybrid_drafter_count_its_sources_apart(tiny_target, tiny_draft, prompts):
    # gamma 2 and 4 of one hybrid share its drafter object (as the final round's neighbours do):
    # each config's per-source counts are its own timed passes', not the pool of both plus the
    # warm-up's.
    hybrid = HybridDrafter(PromptLookupDrafter(1, 3), ModelDrafter(tiny_draft, "draft"), "hybrid")
    small, large = measure_many(tiny_target, [Entry(hybrid, 2), Entry(hybrid, 4)], case(prompts), repeats=2)
    for m, gamma in ((small, 2), (large, 4)):
        assert set(m.metrics.per_source) == {"prompt-lookup", "draft"} and m.stats.proposed > 0
        assert _counted(m, gamma, requests=2 * 3)
        assert sum(s["share"] for s in m.metrics.per_source.values()) == pytest.approx(1.0)
    assert small.stats.proposed != large.stats.proposed


def test_a_batched_hybrid_counts_only_its_timed_passes(tiny_target, tiny_draft, prompts):
    def make():
        return build_drafter(
            DraftSpec("p+draft", "hybrid", path="draft"), tiny_target, {"draft": tiny_draft}, rows=2
        )

    m = measure_batched(tiny_target, make, 3, 0.0, case(prompts), 2, repeats=2)
    assert m.mismatches == 0 and m.stats.proposed > 0
    assert _counted(m, 3, requests=2 * 3)


def test_a_batched_pass_of_fewer_prompts_than_slots_fills_every_slot(tiny_target, prompts, monkeypatch):
    from specdec_tune.measure import batched

    sent = []
    generate = batched.batch_generate

    def counted(target, drafter, c, batch_size, *args, **kwargs):
        sent.append((len(c.prompts), batch_size))
        return generate(target, drafter, c, batch_size, *args, **kwargs)

    monkeypatch.setattr(batched, "batch_generate", counted)
    make = lambda: build_drafter(DraftSpec("lookup", "prompt_lookup"), tiny_target, {}, rows=4)  # noqa: E731
    m = measure_batched(tiny_target, make, 2, 0.0, case(prompts, n=2, max_new=6), 4, repeats=1, warmup=0)
    # two prompts at B = 4: four requests, the two prompts twice, so that B requests are in flight
    assert sent and all(n == 4 and b == 4 for n, b in sent)
    assert m.mismatches == 0
    assert batched.fill_slots(case(prompts, n=5), 4).prompts == prompts[:5]  # enough already: as it was


def test_each_config_records_what_other_processes_took_and_the_planted_hook_slows_its_side(
    tiny_target, tiny_draft, prompts, monkeypatch
):
    """Every measurement says how long its threads waited for a CPU (measure.preemption) and the
    speedups of the repeats rebuilt from unpreempted prompts; the test-only SPECDEC_TEST_SLOWER_SPEC
    makes the speculative side alone slower (measure.planted)."""
    from specdec_tune.measure import planted, preemption

    slept = []
    monkeypatch.setattr(planted.time, "sleep", slept.append)  # the hook's sleep, not taken here
    monkeypatch.setenv(planted.SLOWER_SPEC_ENV, "1.5")
    c = case(prompts)
    model, plain = measure_many(tiny_target, [Entry(ModelDrafter(tiny_draft), 3), Entry(None, 0)], c, 2)
    # each speculative prompt, the timed ones and the warm-up's: half its own seconds again
    assert len(slept) == 2 * len(c.prompts) + 1 and all(s > 0 for s in slept)
    if preemption.thread_waits() is None:
        assert model.clean_share is None and model.clean_speedups == []
        return
    assert 0.0 <= model.clean_share <= 1.0 and 0.0 <= model.waited_share <= 1.0
    assert len(model.clean_speedups) <= 2 and all(x > 0 for x in model.clean_speedups)
    assert plain.clean_speedups == [1.0, 1.0]
