"""The shipped demo pair loads offline and speculation on it is exact and actually accepts drafts."""

from __future__ import annotations

import os

import pytest
from helpers import fast_subset

from specdec_tune.runtime.decode import SpecStats, autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting.drafters import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.models.loading import DEMO_DRAFTS, check_vocab_compatible, eos_ids, load_model
from specdec_tune.runtime.workloads import encode_prompts, load_workload

N_NEW = 32


@pytest.fixture(scope="module")
def demo():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest: nothing may reach a hub
    target = load_model("demo", "cpu")
    drafts = {name: load_model(name, "cpu") for name in DEMO_DRAFTS}
    wl = load_workload("demo-code")
    prompts = encode_prompts(wl, target.tokenizer)[:3]
    refs = [autoregressive_generate(target.model, p, N_NEW, eos=eos_ids(target)).tokens for p in prompts]
    return target, drafts, prompts, refs


def test_demo_models_share_the_vocabulary(demo):
    target, drafts, _, _ = demo
    for d in drafts.values():
        check_vocab_compatible(target, d)
    assert target.num_params > 6 * max(d.num_params for d in drafts.values())


@pytest.mark.parametrize(
    "kind",
    fast_subset(["draft-1l", "draft-2l", "prompt-lookup", "layer-skip"], fast=("draft-1l",)),
)
def test_demo_greedy_is_exact(demo, kind):
    target, drafts, prompts, refs = demo
    if kind in drafts:
        drafter = ModelDrafter(drafts[kind].model)
    elif kind == "prompt-lookup":
        drafter = PromptLookupDrafter(1, 3)
    else:
        drafter = LayerSkipDrafter(target.model, 2)
    stats = SpecStats()
    for p, want in zip(prompts, refs, strict=True):
        for gamma, threshold in ((3, 0.0), (6, 0.4)):
            g = speculative_generate(target.model, drafter, p, gamma, threshold, 0.0, N_NEW, eos_ids(target))
            assert g.tokens == want
            stats.add(g.stats)
    if kind in drafts:
        # Distilled drafts agree with the target most of the time on code.
        assert stats.acceptance_rate > 0.4, stats.acceptance_rate


def test_the_default_demo_space_includes_the_hybrid_of_lookup_and_the_best_model_draft():
    from specdec_tune.runtime.session import load_models

    s = load_models(
        None, None, max_new_tokens=4, device="cpu", limit=1, lazy_drafts=True, engine_mode="eager"
    )
    hybrid = next(d for d in s.specs if d.kind == "hybrid")
    assert hybrid.name == "hybrid:prompt-lookup:3-4+draft-1l" and hybrid.path == "draft-1l"
    assert (hybrid.ngram_min, hybrid.ngram_max) == (3, 4)
    assert [d.name for d in s.specs] == [*DEMO_DRAFTS, "prompt-lookup", hybrid.name]
