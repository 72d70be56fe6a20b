"""The profiler on tiny models: shapes and signs of the costs, state left clean, acceptance = engine's."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_sample_profile, tiny_llama

from specdec_tune.domain import Costs, DraftCosts
from specdec_tune.errors import SpecDecError
from specdec_tune.measure import costs as profiler
from specdec_tune.measure import forward, overheads
from specdec_tune.runtime.decode import SpecStats, speculative_generate
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.workloads import Case
from specdec_tune.search.costmodel import acceptance_vector_from_position_counts
from specdec_tune.store.validate import profile_from_dict
from specdec_tune.store.yamlio import profile_to_dict


@pytest.fixture(autouse=True)
def short_blocks(monkeypatch):
    # Timing quality is not under test here; short blocks keep the suite fast.
    monkeypatch.setattr(forward, "MIN_BLOCK_MS", 1.0)


def _finite_positive(values):
    return all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in values)


def test_forward_curve_has_one_sample_per_size_and_repeat(tiny_target):
    samples = forward.forward_curve_ms(tiny_target, context_len=24, sizes=[1, 2, 4, 7], repeats=3)
    assert [len(x) for x in samples] == [3, 3, 3, 3]
    assert _finite_positive([v for x in samples for v in x])


def test_forward_curve_times_the_forward_itself(tiny_target, monkeypatch):
    """Planted: a forward over more than one token sleeps 4 ms; C_ver must show it and T_target not."""
    import time as _time

    inner = type(tiny_target).forward

    def slow_verify(self, *args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            _time.sleep(0.004)
        return inner(self, *args, **kwargs)

    monkeypatch.setattr(type(tiny_target), "forward", slow_verify)
    t_target, verify = forward.forward_curve_ms(tiny_target, context_len=16, sizes=[1, 3], repeats=3)
    # fastest against fastest: other work only ever adds time (beside another test, once, the
    # T_target samples read 1.8-6.6 ms, and the slowest T_target was compared before)
    assert min(verify) - min(t_target) > 3.0


def test_forward_timing_leaves_the_cache_as_it_found_it(tiny_target):
    with torch.inference_mode():
        cache, new_ids = forward.warm_cache(tiny_target, context_len=20, extra=5)
    forward.forward_samples_ms(tiny_target, cache, new_ids, [1, 3, 5], repeats=2)
    assert cache.cache.get_seq_length() == 20
    # Same length is not enough: the kept keys/values must still be those of the context.
    x = torch.tensor([new_ids[:1]])
    with torch.inference_mode():
        after = cache.forward(x)
        fresh, _ = forward.warm_cache(tiny_target, context_len=20, extra=5)
        expected = fresh.forward(x)
    torch.testing.assert_close(after, expected)


def test_measuring_twice_does_not_grow_the_context(tiny_target):
    first = forward.forward_curve_ms(tiny_target, 16, [2, 5], 2)
    second = forward.forward_curve_ms(tiny_target, 16, [2, 5], 2)
    assert [len(x) for x in first] == [len(x) for x in second] == [2, 2]
    # Loose on purpose (shared CI cores): a leak would grow the context and the cost every call.
    assert max(map(max, second)) < 50 * max(map(max, first))


def test_t_draft_of_a_model_rolls_its_cache_back(tiny_draft):
    drafter = ModelDrafter(tiny_draft)
    seq = list(range(1, 21))
    ms = profiler.measure_t_draft_ms(drafter, seq, repeats=2, gamma=4)
    assert _finite_positive([ms])
    assert drafter.cached == len(seq)
    kv_len = drafter.lean.length if drafter.lean is not None else drafter.cache.get_seq_length()
    assert kv_len == len(seq)


def test_t_draft_of_prompt_lookup_with_and_without_matches():
    repetitive = [5, 6, 7, 8] * 5
    assert _finite_positive([profiler.measure_t_draft_ms(PromptLookupDrafter(), repetitive, 2)])
    # No earlier match at all: it proposes nothing and is charged its overhead per call.
    assert _finite_positive([profiler.measure_t_draft_ms(PromptLookupDrafter(), list(range(1, 30)), 2)])


def test_t_draft_needs_a_context(tiny_draft):
    with pytest.raises(SpecDecError, match="non-empty"):
        profiler.measure_t_draft_ms(ModelDrafter(tiny_draft), [], 2)


def test_acceptance_vector_matches_the_engines_own_counts(tiny_target, tiny_draft, prompts):
    gamma, budget = 5, 16
    case = Case(prompts, [budget] * len(prompts))
    vector, alpha, stats = profiler.acceptance_vector(tiny_target, ModelDrafter(tiny_draft), case, gamma)

    expected = SpecStats()
    for p in prompts:
        gen = speculative_generate(tiny_target, ModelDrafter(tiny_draft), p, gamma, max_new_tokens=budget)
        expected.add(gen.stats)
    assert expected.proposed > 0
    assert stats.reached_at == expected.reached_at
    assert stats.accepted_at == expected.accepted_at
    assert alpha == expected.acceptance_rate
    assert len(vector) == gamma
    assert all(0.0 <= a <= 1.0 for a in vector)
    assert vector[: len(expected.per_position_acceptance)] == expected.per_position_acceptance
    # Padding follows the cost model's rule for positions never reached.
    by_costmodel = acceptance_vector_from_position_counts(expected.reached_at, expected.accepted_at)
    assert vector == by_costmodel + [by_costmodel[-1]] * (gamma - len(by_costmodel))


def test_acceptance_vector_stops_after_max_steps(tiny_target, tiny_draft, prompts):
    case = Case(prompts, [16] * len(prompts))
    _, _, capped = profiler.acceptance_vector(tiny_target, ModelDrafter(tiny_draft), case, 4, max_steps=1)
    first = speculative_generate(tiny_target, ModelDrafter(tiny_draft), prompts[0], 4, max_new_tokens=16)
    assert capped.target_forwards == first.stats.target_forwards


def test_acceptance_vector_of_a_drafter_that_never_proposes_is_zero(tiny_target):
    case = Case([list(range(1, 12))], [6])
    vector, alpha, stats = profiler.acceptance_vector(tiny_target, PromptLookupDrafter(3, 3), case, 3)
    assert stats.proposed == 0
    assert (vector, alpha) == ([0.0, 0.0, 0.0], 0.0)


@pytest.mark.parametrize("max_gamma", [0, 65])
def test_max_gamma_out_of_range_is_a_user_error(tiny_target, tiny_draft, prompts, max_gamma):
    with pytest.raises(SpecDecError, match=r"1\.\.64"):
        profiler.acceptance_vector(tiny_target, ModelDrafter(tiny_draft), Case(prompts, [4] * 5), max_gamma)
    with pytest.raises(SpecDecError, match=r"1\.\.64"):
        profiler.measure_costs(tiny_target, {}, Case(prompts, [4] * 5), "cpu", max_gamma=max_gamma)


def test_context_longer_than_the_model_allows_is_a_user_error(tiny_target):
    with pytest.raises(SpecDecError, match="max_position_embeddings"):
        forward.forward_curve_ms(tiny_target, 510, list(range(1, 10)), 1)


def test_copy_bandwidth_and_matmul_throughput_are_positive():
    gbps, spread = forward.measure_copy_bandwidth_gbps("cpu", mib=8, repeats=2)
    assert _finite_positive([gbps])
    assert math.isfinite(spread) and spread >= 0
    assert _finite_positive([forward.measure_matmul_tflops("cpu", torch.float32, n=128, repeats=2)])


def test_default_context_len():
    assert profiler.default_context_len(Case([[1] * 40, [1] * 60, [1] * 100], [64, 128, 32])) == 92
    assert profiler.default_context_len(Case([[1]], [2])) == 16


def test_decode_weight_bytes_counts_a_tied_embedding_once():
    untied = tiny_llama(layers=1)  # its config does not tie the LM head to the embedding
    total = sum(p.numel() * p.element_size() for p in untied.parameters())
    embedding = untied.get_input_embeddings().weight
    assert forward.decode_weight_bytes(untied) == total - embedding.numel() * embedding.element_size()
    untied.lm_head.weight = untied.get_input_embeddings().weight
    tied_total = sum(p.numel() * p.element_size() for p in untied.parameters())
    assert forward.decode_weight_bytes(untied) == tied_total


def test_oracle_drafter_is_always_accepted_and_exact(tiny_target, prompts):
    from specdec_tune.runtime.decode import autoregressive_generate

    prompt = prompts[2]
    truth = autoregressive_generate(tiny_target, prompt, 20).tokens
    oracle = overheads.OracleDrafter(prompt + truth)
    g = speculative_generate(tiny_target, oracle, prompt, 4, 0.0, 0.0, 20)
    assert g.tokens == truth
    assert g.stats.accepted == g.stats.proposed > 0 and g.stats.target_forwards == 4  # 5 tokens per step


def test_loop_overheads_are_finite_and_the_model_is_restored(tiny_target):
    loop, step = overheads.measure_loop_overheads_ms(tiny_target, 24, 3, repeats=3, new_tokens=12)
    assert math.isfinite(loop) and math.isfinite(step) and loop >= 0 and step >= 0
    assert "forward" not in vars(tiny_target)  # the clock's wrapper is gone again
    with pytest.raises(SpecDecError):
        overheads.measure_loop_overheads_ms(tiny_target, 24, 0, repeats=1)


def test_forward_clock_counts_calls_and_time_inside_forward(tiny_target):
    x = torch.tensor([[1, 2, 3]])
    with torch.inference_mode(), overheads.ForwardClock(tiny_target, "cpu") as clock:
        tiny_target(input_ids=x)
        tiny_target(input_ids=x)
    assert clock.calls == 2 and clock.ms > 0
    assert "forward" not in vars(tiny_target)


def test_slow_host_work_per_step_shows_up_as_step_overhead(tiny_target, monkeypatch):
    """Planted: 3 ms of host work per speculative step (in the drafter) must appear in o_step."""
    import time as _time

    _, fast = overheads.measure_loop_overheads_ms(tiny_target, 24, 2, repeats=3, new_tokens=12)
    propose = overheads.OracleDrafter.propose

    def slow(self, *args):
        _time.sleep(0.003)
        return propose(self, *args)

    monkeypatch.setattr(overheads.OracleDrafter, "propose", slow)
    loop, slow_step = overheads.measure_loop_overheads_ms(tiny_target, 24, 2, repeats=3, new_tokens=12)
    # Lower bounds only: a busy machine adds time, it never removes the planted 3 ms.
    assert slow_step - fast > 2.0
    assert slow_step - loop > 2.0  # the plain loop has no drafter: untouched


@pytest.mark.slow  # the whole costs pass
def test_measure_costs_fills_every_field_and_reports_progress(tiny_target, tiny_draft, prompts):
    case = Case(prompts, [12] * len(prompts))
    drafters = {"draft": ModelDrafter(tiny_draft), "lookup": PromptLookupDrafter()}
    calls = []
    costs = profiler.measure_costs(
        tiny_target,
        drafters,
        case,
        "cpu",
        max_gamma=4,
        repeats=2,
        progress=lambda label, done: calls.append((label, done)),
        acceptance_tokens=8,
    )
    assert isinstance(costs, Costs)
    assert costs.context_len == profiler.default_context_len(case)
    assert len(costs.verify_ms) == 4 and _finite_positive(costs.verify_ms)
    assert _finite_positive([costs.t_target_ms])
    for value in (costs.copy_bandwidth_gbps, costs.decode_bandwidth_gbps, costs.roofline_share):
        assert _finite_positive([value])
    assert _finite_positive([costs.matmul_tflops])
    assert costs.loop_overhead_ms >= 0 and costs.step_overhead_ms >= 0
    assert math.isfinite(costs.loop_overhead_ms) and math.isfinite(costs.step_overhead_ms)
    assert costs.roofline_share == pytest.approx(costs.decode_bandwidth_gbps / costs.copy_bandwidth_gbps)
    assert [d.name for d in costs.drafts] == ["draft", "lookup"]
    for d in costs.drafts:
        assert isinstance(d, DraftCosts)
        assert len(d.acceptance_vector) == 4
        assert d.c == pytest.approx(d.t_draft_ms / costs.t_target_ms)

    fractions = [f for _, f in calls]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert fractions == sorted(fractions)
    assert any("lookup" in label for label, _ in calls)

    # A profile carrying these costs passes the schema's validation, through YAML-able data.
    data = profile_to_dict(make_sample_profile(costs=costs))
    assert profile_from_dict(data).costs.verify_ms == data["costs"]["verify_ms"]


def test_measure_costs_without_bandwidth_skips_the_micro_benchmarks(tiny_target, prompts):
    costs = profiler.measure_costs(
        tiny_target, {}, Case(prompts, [4] * 5), "cpu", max_gamma=2, repeats=1, with_bandwidth=False
    )
    assert costs.copy_bandwidth_gbps is None and costs.matmul_tflops is None
    assert costs.roofline_share is None
    assert _finite_positive([costs.decode_bandwidth_gbps])


def test_effective_acceptance_counts_empty_positions_as_rejected():
    from specdec_tune.search.costmodel import expected_tokens

    # gamma 4 each step: (allowed g, proposed k, accepted n). Step 1 proposed nothing, step 3 only 2.
    steps = [(4, 0, 0), (4, 4, 2), (4, 2, 2), (4, 4, 4), (4, 3, 1)]
    st = SpecStats.from_steps(steps, forwards=len(steps), emitted=sum(n + 1 for _, _, n in steps))
    assert st.allowed_at == [5, 4, 3, 1]
    assert st.accepted_at == [4, 3, 1, 1] and st.reached_at == [4, 4, 2, 1]
    assert st.effective_acceptance == [4 / 5, 3 / 4, 1 / 3, 1 / 1]
    # Conditional on a proposal it looks better than it is: 4/4 at position 1.
    assert st.per_position_acceptance[0] == 1.0
    # Without a max_new_tokens cap, the effective vector reproduces tokens per step exactly.
    assert expected_tokens(st.effective_acceptance, 4) == pytest.approx(st.mean_accepted_len)
    merged = SpecStats()
    merged.add(st)
    merged.add(st)
    assert merged.allowed_at == [10, 8, 6, 2] and merged.effective_acceptance == st.effective_acceptance


def test_prompt_lookup_vector_charges_missing_proposals(tiny_target, prompts):
    case = Case(prompts, [16] * len(prompts))
    vector, _, stats = profiler.acceptance_vector(tiny_target, PromptLookupDrafter(1, 3), case, 4)
    assert stats.proposed > 0
    assert vector[0] <= stats.per_position_acceptance[0]
    assert vector[: len(stats.effective_acceptance)] == stats.effective_acceptance
