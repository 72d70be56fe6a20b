"""The engine is exact: greedy speculative output equals the target's own greedy decoding."""

from __future__ import annotations

import pytest
import torch
from helpers import VOCAB, fast_subset, noisy_copy, tiny_llama
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.decode import SpecStats, autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting import drafters as drafters_mod
from specdec_tune.runtime.drafting.drafters import (
    LayerSkipDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    truncated_view,
)

MAX_NEW = 24


def drafters(target, draft, ctx=None):
    """Every drafter with every engine policy (HF/vLLM earliest match, llama.cpp's top-k p-min);
    the model drafters (the lean forward off, so their caches are `ctx`'s) under `ctx`."""
    return [
        ModelDrafter(draft, ctx=ctx),
        ModelDrafter(draft, lean=False, ctx=ctx),
        ModelDrafter(draft, name="draft-topk10", threshold_mode="topk10", ctx=ctx),
        PromptLookupDrafter(1, 3),
        PromptLookupDrafter(1, 3, name="lookup-earliest", match="earliest"),
        LayerSkipDrafter(target, 1, ctx=ctx),
        LayerSkipDrafter(target, 1, "skip-topk10", threshold_mode="topk10", ctx=ctx),
    ]


def hf_greedy(model, prompt, max_new, eos=None):
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def hf_reference(tiny_target, prompts):
    return [hf_greedy(tiny_target, p, MAX_NEW) for p in prompts]


def test_baseline_equals_transformers_generate(tiny_target, prompts, hf_reference, ctx):
    for p, want in zip(prompts, hf_reference, strict=False):
        assert autoregressive_generate(tiny_target, p, MAX_NEW, ctx=ctx).tokens == want


@pytest.mark.parametrize("gamma", fast_subset(range(1, 9), fast=(8,)))
@pytest.mark.parametrize("threshold", fast_subset([0.0, 0.5], fast=(0.5,)))
def test_greedy_speculation_is_exact(tiny_target, tiny_draft, prompts, hf_reference, gamma, threshold, ctx):
    for p, want in zip(prompts, hf_reference, strict=False):
        for d in drafters(tiny_target, tiny_draft, ctx):
            got = speculative_generate(tiny_target, d, p, gamma, threshold, 0.0, MAX_NEW, ctx=ctx)
            assert got.tokens == want, (d.name, gamma, threshold, p, ctx.mode)
            assert len(got.tokens) == MAX_NEW


def test_drafts_are_actually_accepted(tiny_target, tiny_draft, prompts):
    # Exactness alone would also hold for a drafter that is always rejected.
    stats = SpecStats()
    for p in prompts:
        stats.add(speculative_generate(tiny_target, ModelDrafter(tiny_draft), p, 4, 0.0, 0.0, MAX_NEW).stats)
    assert stats.acceptance_rate > 0.3
    assert stats.mean_accepted_len > 1.5
    lookup = speculative_generate(tiny_target, PromptLookupDrafter(1, 3), prompts[-1], 4, 0.0, 0.0, MAX_NEW)
    assert lookup.stats.proposed > 0


def test_eos_inside_accepted_draft_stops_there(tiny_target, tiny_draft, prompts):
    p = prompts[2]
    free = autoregressive_generate(tiny_target, p, 40).tokens
    # Pick an EOS that first appears mid-way, so it is likely to sit inside an accepted draft.
    pos = next(i for i in range(6, 40) if free[i] not in free[:i])
    eos = free[pos]
    want = hf_greedy(tiny_target, p, 40, eos=eos)
    assert want == free[: pos + 1]
    for d in drafters(tiny_target, tiny_draft):
        for gamma in (1, 3, 8):
            got = speculative_generate(tiny_target, d, p, gamma, 0.0, 0.0, 40, eos=eos)
            assert got.tokens == want, (d.name, gamma)


def test_max_new_tokens_mid_draft(tiny_target, tiny_draft, prompts):
    for n in (1, 2, 3, 5, 7):
        want = autoregressive_generate(tiny_target, prompts[1], n).tokens
        for d in drafters(tiny_target, tiny_draft):
            got = speculative_generate(tiny_target, d, prompts[1], 8, 0.0, 0.0, n)
            assert got.tokens == want
            assert got.stats.emitted == n


def test_stats_are_consistent(tiny_target, tiny_draft, prompts):
    g = speculative_generate(tiny_target, ModelDrafter(tiny_draft), prompts[3], 5, 0.0, 0.0, 40)
    s = g.stats
    assert s.emitted == len(g.tokens) == 40
    assert 0 < s.accepted <= s.proposed <= 5 * s.target_forwards
    assert s.reached_at[0] == s.target_forwards  # position 1 is verified at every step
    assert sum(s.accepted_at) == s.accepted
    assert s.mean_accepted_len == pytest.approx(40 / s.target_forwards)
    assert all(0.0 <= a <= 1.0 for a in s.per_position_acceptance)


def test_threshold_stops_drafting_early(tiny_target, tiny_draft, prompts):
    free = speculative_generate(tiny_target, ModelDrafter(tiny_draft), prompts[3], 8, 0.0, 0.0, 40).stats
    picky = speculative_generate(tiny_target, ModelDrafter(tiny_draft), prompts[3], 8, 0.9, 0.0, 40).stats
    assert picky.proposed / picky.target_forwards < free.proposed / free.target_forwards


def test_prompt_lookup_proposes_most_recent_match():
    d = PromptLookupDrafter(1, 2)
    seq = [1, 2, 3, 9, 1, 2, 4, 5, 1, 2]
    d.start(seq)
    assert d.propose(seq, 2, 0.0, 0.0, None)[0].tolist() == [4, 5]  # the later "1 2" wins
    seq2 = [*seq, 4, 7, 7]
    assert d.propose(seq2, 3, 0.0, 0.0, None)[0].tolist() == [7]  # longest n first, then latest
    assert d.propose([8], 3, 0.0, 0.0, None)[0].numel() == 0


def test_prompt_lookup_earliest_match_is_hf_and_vllm_policy():
    d = PromptLookupDrafter(1, 2, match="earliest")
    seq = [1, 2, 3, 9, 1, 2, 4, 5, 1, 2]
    d.start(seq)
    assert d.propose(seq, 2, 0.0, 0.0, None)[0].tolist() == [3, 9]  # the first "1 2" wins
    seq2 = [*seq, 4, 7, 7]
    assert d.propose(seq2, 3, 0.0, 0.0, None)[0].tolist() == [7]  # longest n first
    with pytest.raises(SpecDecError, match="earliest"):
        PromptLookupDrafter(1, 2, match="first")


def test_topk10_confidence_is_llamacpp_p_min():
    # 12 logits: the top-1 share of the top-10 softmax, not of the full softmax
    logits = torch.tensor([3.0, 2.0, *([1.0] * 8), 0.5, 0.5])
    top10 = torch.softmax(torch.tensor([3.0, 2.0, *([1.0] * 8)]), -1)[0].item()
    assert drafters_mod._topk10_confidence(logits) == pytest.approx(top10)
    assert top10 > torch.softmax(logits, -1)[0].item()  # so the same t stops drafting later


def test_topk10_threshold_drops_the_unsure_token(tiny_target, tiny_draft, prompts):
    """HF proposes the unsure token and stops after it; llama.cpp stops before it."""
    p = prompts[3]
    hf = ModelDrafter(tiny_draft)
    llama = ModelDrafter(tiny_draft, threshold_mode="topk10")
    hf.start(p)
    llama.start(p)
    # t just above the first token's confidence in both senses: HF proposes 1, llama.cpp 0
    hf_first = hf.propose(p, 4, 0.999999, 0.0, None)[0]
    llama_first = llama.propose(p, 4, 0.999999, 0.0, None)[0]
    assert hf_first.numel() == 1 and llama_first.numel() == 0
    assert llama.cached == len(p)  # the prompt was fed, nothing beyond it
    # the engine then adds the target's token; the drafter goes on from there (t = 0: gamma tokens)
    llama.commit(len(p))
    assert llama.propose([*p, int(hf_first[0])], 4, 0.0, 0.0, None)[0].numel() == 4
    with pytest.raises(SpecDecError, match="threshold mode"):
        ModelDrafter(tiny_draft, threshold_mode="p-min")


def test_layer_skip_view_shares_weights_and_leaves_target_intact(tiny_target):
    view = truncated_view(tiny_target, 1)
    assert len(view.model.layers) == 1 and len(tiny_target.model.layers) == 3
    assert view.lm_head.weight.data_ptr() == tiny_target.lm_head.weight.data_ptr()
    assert tiny_target.config.num_hidden_layers == 3
    with pytest.raises(SpecDecError, match="layers"):
        truncated_view(tiny_target, 3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gamma": -1},
        {"gamma": 65},
        {"threshold": 1.0},
        {"threshold": -0.1},
        {"temperature": -1.0},
        {"max_new_tokens": 0},
    ],
)
def test_bad_arguments_are_user_errors(tiny_target, tiny_draft, kwargs):
    args = {"gamma": 2, "threshold": 0.0, "temperature": 0.0, "max_new_tokens": 4} | kwargs
    with pytest.raises(SpecDecError):
        speculative_generate(tiny_target, ModelDrafter(tiny_draft), [1, 2], **args)


def test_empty_prompt_is_a_user_error(tiny_target, tiny_draft):
    with pytest.raises(SpecDecError, match="empty"):
        speculative_generate(tiny_target, ModelDrafter(tiny_draft), [], 2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    layers=st.integers(2, 3),
    noise=st.sampled_from([0.0, 0.01, 0.05, 0.5]),
    kind=st.sampled_from(["model", "model_topk10", "lookup", "lookup_earliest", "layer_skip"]),
    gamma=st.integers(1, 10),
    threshold=st.sampled_from([0.0, 0.3, 0.8]),
    prompt=st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=20),
    max_new=st.integers(1, 20),
    eos=st.one_of(st.none(), st.integers(1, VOCAB - 1)),
)
def test_property_greedy_exact(seed, layers, noise, kind, gamma, threshold, prompt, max_new, eos):
    target = tiny_llama(layers=layers, hidden=32, seed=seed)
    if kind == "model":
        drafter = ModelDrafter(noisy_copy(target, noise, seed=seed + 1))
    elif kind == "model_topk10":
        drafter = ModelDrafter(noisy_copy(target, noise, seed=seed + 1), threshold_mode="topk10")
    elif kind in ("lookup", "lookup_earliest"):
        drafter = PromptLookupDrafter(1, 3, match="earliest" if kind == "lookup_earliest" else None)
    else:
        drafter = LayerSkipDrafter(target, 1)
    want = autoregressive_generate(target, prompt, max_new, eos=eos).tokens
    got = speculative_generate(target, drafter, prompt, gamma, threshold, 0.0, max_new, eos=eos)
    assert got.tokens == want
    assert got.stats.emitted == len(want)
