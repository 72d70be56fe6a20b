"""Dynamic drafting is exact: the hybrid drafter (prompt lookup, then a draft model) and the adaptive
gamma policies give the target's own greedy output (batch 1 and batched, against
transformers.generate) and its sampling distribution (χ²), and count who proposed what."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import check_rows, fast_subset, noisy_copy, tiny_llama
from test_engine import MAX_NEW, hf_greedy
from test_sampling import (
    DEPTH,
    P_FAIL,
    P_PASS,
    _resample_from_p,
    chi2_p_value,
    exact_joint,
    sample_speculative,
)

from specdec_tune.domain import DraftSpec
from specdec_tune.errors import SpecDecError
from specdec_tune.runtime import decode as engine
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.decode import speculative_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.drafting.hybrid import HybridDrafter, hybrid_parts, mixed_q, source_stats
from specdec_tune.runtime.drafting.policies import (
    BatchPolicyDrafter,
    CostModelGamma,
    HeuristicGamma,
    PolicyDrafter,
    make_policy,
)
from specdec_tune.runtime.workloads import Case

HYBRID = DraftSpec("hybrid:prompt-lookup+draft", "hybrid", path="draft", ngram_min=1, ngram_max=3)
HYBRID_SKIP = DraftSpec("hybrid:prompt-lookup+layer-skip-1", "hybrid", ngram_min=1, ngram_max=3, layers=1)
# alpha 0..1 -> gamma 1..4 and back down, so the costmodel policy really changes gamma
TABLE = [1] * 30 + [2] * 30 + [4] * 31 + [3] * 10


def policies(gamma: int):
    return [
        make_policy("fixed", gamma),
        make_policy("heuristic", gamma),
        make_policy("costmodel", gamma, TABLE, 0.5),
    ]


def hybrids(target, draft, ctx=None):
    return [
        HybridDrafter(PromptLookupDrafter(1, 3), ModelDrafter(draft, "draft", ctx=ctx), "hybrid"),
        HybridDrafter(
            PromptLookupDrafter(2, 2),
            ModelDrafter(draft, "d", lean=False, threshold_mode="topk10", ctx=ctx),
            "h2",
        ),
        HybridDrafter(PromptLookupDrafter(1, 3), LayerSkipDrafter(target, 1, ctx=ctx), "hybrid-skip"),
    ]


# --- policies ----------------------------------------------------------------------------------


def test_heuristic_policy_follows_transformers():
    p = HeuristicGamma(6)
    assert p.gamma() == 6
    p.update(6, 6, 2)
    assert p.gamma() == 5
    p.update(5, 5, 5)
    assert p.gamma() == 6  # +2, capped at gamma max
    for _ in range(10):
        p.update(p.gamma(), p.gamma(), 0)
    assert p.gamma() == 1  # never below 1
    p.update(1, 0, 0)  # the drafter proposed nothing: not a fully accepted step
    assert p.gamma() == 1


def test_costmodel_policy_tracks_acceptance():
    p = CostModelGamma(4, TABLE, prior_alpha=0.5)
    assert p.gamma() == 2
    for _ in range(20):
        p.update(p.gamma(), p.gamma(), p.gamma())  # everything accepted: alpha -> 1
    assert p.alpha > 0.9 and p.gamma() == 3
    for _ in range(20):
        p.update(p.gamma(), p.gamma(), 0)
    assert p.alpha < 0.1 and p.gamma() == 1
    with pytest.raises(SpecDecError, match="costs"):
        make_policy("costmodel", 4, None)
    with pytest.raises(SpecDecError, match="unknown gamma policy"):
        make_policy("sometimes", 4)


# --- greedy: equal to transformers.generate ----------------------------------------------------


@pytest.fixture(scope="module")
def hf_reference(tiny_target, prompts):
    return [hf_greedy(tiny_target, p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize("gamma", fast_subset([1, 3, 6], fast=(3,)))
@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_hybrid_greedy_is_exact(tiny_target, tiny_draft, prompts, hf_reference, gamma, threshold, ctx):
    for d in hybrids(tiny_target, tiny_draft, ctx):
        for p, want in zip(prompts, hf_reference, strict=True):
            got = speculative_generate(tiny_target, d, p, gamma, threshold, 0.0, MAX_NEW, ctx=ctx)
            assert got.tokens == want, (d.name, gamma, threshold, p)
    stats = source_stats(d)
    assert stats["prompt-lookup"]["proposed"] > 0 and stats["layer-skip-1"]["proposed"] > 0


@pytest.mark.parametrize("gamma", fast_subset([2, 5], fast=(2,)))
def test_adaptive_gamma_greedy_is_exact(tiny_target, tiny_draft, prompts, hf_reference, gamma, ctx):
    inner = [
        ModelDrafter(tiny_draft, ctx=ctx),
        PromptLookupDrafter(1, 3),
        *hybrids(tiny_target, tiny_draft, ctx)[:1],
    ]
    for make in policies(gamma):
        for d in inner:
            wrapped = PolicyDrafter(d, make)
            for p, want in zip(prompts, hf_reference, strict=True):
                got = speculative_generate(tiny_target, wrapped, p, gamma, 0.0, 0.0, MAX_NEW, ctx=ctx)
                assert got.tokens == want, (d.name, gamma, p)


def test_source_counts_add_up(tiny_target, tiny_draft, prompts):
    d = hybrids(tiny_target, tiny_draft)[0]
    for p in prompts:
        speculative_generate(tiny_target, d, p, 4, 0.0, 0.0, MAX_NEW)
    s = source_stats(d)
    look, model = s["prompt-lookup"], s["draft"]
    assert look["proposed"] > 0 and model["proposed"] > 0
    assert look["accepted"] <= look["proposed"] and model["accepted"] <= model["proposed"]
    assert look["share"] + model["share"] == pytest.approx(1.0)
    assert 0.0 < look["steps_with_match"] <= 1.0


def test_hybrid_parts_and_mixed_q():
    look, model = hybrid_parts(HYBRID)
    assert (look.kind, look.ngram_max, model.kind, model.name) == ("prompt_lookup", 3, "model", "draft")
    assert hybrid_parts(HYBRID_SKIP)[1].kind == "layer_skip"
    q = torch.softmax(torch.randn(2, 5), -1)
    mixed = mixed_q(torch.tensor([3, 7]), q, 1.0)  # a lookup id beyond the draft's vocabulary
    assert mixed.shape == (4, 8) and mixed[1, 7] == 1.0 and mixed[0].sum() == 1.0
    assert mixed_q(torch.tensor([3]), q, 0.0) is None and mixed_q(torch.tensor([3]), None, 1.0) is None


# --- batched: every row equal to transformers.generate -----------------------------------------


@pytest.fixture(scope="module")
def workload(tiny_target, prompts):
    g = torch.Generator().manual_seed(3)
    extra = [torch.randint(1, 95, (n,), generator=g).tolist() for n in (3, 17, 8)]
    all_prompts = prompts + extra
    budgets = [16, 9, 20, 5, 12, 16, 3, 14][: len(all_prompts)]
    return Case(all_prompts, budgets, [], 0.0)


@pytest.fixture(scope="module")
def reference(tiny_target, workload):
    return [
        hf_greedy(tiny_target, p, b, None)
        for p, b in zip(workload.prompts, workload.max_new_tokens, strict=True)
    ]


@pytest.mark.parametrize("spec", [HYBRID, HYBRID_SKIP], ids=["model", "layer-skip"])
@pytest.mark.parametrize("batch_size", fast_subset([2, 5], fast=(2,)))
def test_batched_hybrid_and_policies_equal_generate(
    tiny_target, tiny_draft, workload, reference, spec, batch_size, ctx
):
    for gamma, threshold in ((1, 0.0), (3, 0.5), (6, 0.0)):
        for make in policies(gamma):
            inner = build_drafter(spec, tiny_target, {"draft": tiny_draft}, ctx, rows=batch_size)
            drafter = BatchPolicyDrafter(inner, make, batch_size)
            run = batch_generate(tiny_target, drafter, workload, batch_size, gamma, threshold, ctx=ctx)
            assert check_rows(tiny_target, workload, run.outputs, reference) == 0
            assert run.stats.proposed > 0
    counts = source_stats(drafter)
    assert all(v["proposed"] > 0 for v in counts.values())


# --- sampling: χ² against the target's exact joint ---------------------------------------------


@pytest.fixture(scope="module")
def pair():
    from test_sampling import VOCAB, Memoized

    target = tiny_llama(layers=1, hidden=16, vocab=VOCAB, seed=3, init=0.5)
    return {"target": Memoized(target), "noisy": Memoized(noisy_copy(target, 0.3, seed=4))}


# The last token's only earlier occurrence is just before it: lookup proposes one token, the model
# drafts the rest, so the verifier sees a one-hot row and a model row in the same step.
MIXED_PROMPT = [3, 5, 5]


@pytest.mark.slow
def test_hybrid_sampling_is_exact(pair):
    target = pair["target"]
    d = HybridDrafter(PromptLookupDrafter(1, 3), ModelDrafter(pair["noisy"], "noisy"), "hybrid")
    counts, stats = sample_speculative(target, d, MIXED_PROMPT, 3, 0.0, 1.0, seed=21)
    s = source_stats(d)
    assert s["prompt-lookup"]["proposed"] > 0 and s["noisy"]["proposed"] > 0
    assert 0.1 < stats.acceptance_rate < 0.95
    assert chi2_p_value(counts, exact_joint(target, MIXED_PROMPT, 1.0, DEPTH)) > P_PASS


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["heuristic", "costmodel"])
def test_adaptive_gamma_sampling_is_exact(pair, policy):
    target = pair["target"]
    # one policy for all samples (start() resets it per generation, so keep it running instead)
    d = PolicyDrafter(ModelDrafter(pair["noisy"], "noisy"), make_policy(policy, 2, TABLE, 0.5))
    d.start = lambda prompt: d.inner.inner.start(0, prompt)  # the policy state carries over: still exact
    counts, _ = sample_speculative(target, d, [1], 2, 0.0, 1.0, seed=22)
    assert chi2_p_value(counts, exact_joint(target, [1], 1.0, DEPTH)) > P_PASS


@pytest.mark.slow
def test_hybrid_sampling_test_catches_a_biased_verifier(pair, monkeypatch):
    monkeypatch.setattr(engine, "verify_sampling", _resample_from_p)
    d = HybridDrafter(PromptLookupDrafter(1, 3), ModelDrafter(pair["noisy"], "noisy"), "hybrid")
    counts, _ = sample_speculative(pair["target"], d, MIXED_PROMPT, 3, 0.0, 1.0, seed=23)
    assert chi2_p_value(counts, exact_joint(pair["target"], MIXED_PROMPT, 1.0, DEPTH)) < P_FAIL


def _batched_first_two(n: int = 3000):
    vocab = 8
    target = tiny_llama(layers=1, hidden=16, vocab=vocab, seed=5, init=0.8)
    draft = noisy_copy(target, 0.03, seed=6)
    prompt = MIXED_PROMPT
    with torch.inference_mode():
        p1 = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1)
        p2 = torch.softmax(
            target(input_ids=torch.tensor([[*prompt, t] for t in range(vocab)])).logits[:, -1].double(), -1
        )
    probs = {(a, b): float(p1[a] * p2[a, b]) for a in range(vocab) for b in range(vocab)}
    case = Case([prompt] * n, [3] * n, [], 1.0)
    inner = build_drafter(HYBRID, target, {"draft": draft}, rows=4)
    drafter = BatchPolicyDrafter(inner, make_policy("heuristic", 2), 4)
    run = batch_generate(target, drafter, case, 4, 2, seed=11)
    s = source_stats(drafter)
    assert s["prompt-lookup"]["proposed"] > 0 and s["draft"]["proposed"] > 0
    return Counter(tuple(o[:2]) for o in run.outputs), probs


@pytest.mark.slow
def test_batched_hybrid_sampling_is_exact_per_row():
    assert chi2_p_value(*_batched_first_two()) > P_PASS


@pytest.mark.slow
def test_batched_hybrid_sampling_test_catches_a_biased_verifier(monkeypatch):
    from specdec_tune.runtime import batch

    monkeypatch.setattr(batch, "verify_sampling", _resample_from_p)
    assert chi2_p_value(*_batched_first_two()) < P_FAIL
