"""The lean draft forward computes what transformers computes, across prefill, decode, crop and growth."""

from __future__ import annotations

import torch
from helpers import tiny_llama

from specdec_tune.runtime.caches.dynamic import new_cache
from specdec_tune.runtime.drafting.drafters import ModelDrafter
from specdec_tune.runtime.drafting.leandraft import LeanLlama, supports


def test_lean_logits_match_transformers():
    model = tiny_llama(layers=2, hidden=64)  # 4 heads, 2 KV heads: grouped-query attention
    lean = LeanLlama(model, capacity=8)  # small, so it must grow twice
    ids = torch.randint(1, 90, (24,), generator=torch.Generator().manual_seed(0))
    cache = new_cache(model)
    with torch.inference_mode():
        want = model(input_ids=ids[None, :12], cache=cache, use_cache=True).logits[0, -1]
        torch.testing.assert_close(lean.forward(ids[:12]), want, atol=1e-5, rtol=1e-5)
        for j in range(12, 20):
            want = model(input_ids=ids[None, j : j + 1], cache=cache, use_cache=True).logits[0, -1]
            torch.testing.assert_close(lean.forward(ids[j : j + 1]), want, atol=1e-5, rtol=1e-5)
        cache.crop(-3)
        lean.crop(17)
        want = model(input_ids=ids[None, 17:24], cache=cache, use_cache=True).logits[0, -1]
        torch.testing.assert_close(lean.forward(ids[17:24]), want, atol=1e-5, rtol=1e-5)
    assert lean.length == 24 and lean.k.shape[2] >= 24


def test_unsupported_models_keep_transformers_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).eval()
    assert not supports(gpt2)
    assert ModelDrafter(gpt2).lean is None
    assert ModelDrafter(tiny_llama(layers=1)).lean is not None
    assert ModelDrafter(tiny_llama(layers=1), lean=False).lean is None


def test_a_compiled_draft_on_a_cpu_keeps_the_lean_forward():
    # Only a GPU's compiled mode gives the draft the mode's graphs (its lean forward is eager and
    # launch-bound there); on a CPU the lean forward stays in every mode (test_modes checks the
    # mode's own draft path against the target's greedy output).
    from specdec_tune.runtime.batch import BatchModelDrafter
    from specdec_tune.runtime.caches.modes import ExecutionContext
    from specdec_tune.runtime.drafting.leandraft import LeanLlamaRows, runs_lean

    for mode in ("eager", "static", "compiled"):
        ctx = ExecutionContext(mode=mode)
        drafter = ModelDrafter(tiny_llama(layers=1), ctx=ctx)
        assert drafter.device.type == "cpu" and drafter.lean is not None
        assert isinstance(BatchModelDrafter(tiny_llama(layers=1), 2, ctx=ctx).kv, LeanLlamaRows)
        assert not runs_lean(tiny_llama(layers=1), ctx, lean=False)


def test_lean_and_transformers_drafters_propose_the_same(tiny_draft, prompts):
    for p in prompts:
        a, b = ModelDrafter(tiny_draft), ModelDrafter(tiny_draft, lean=False)
        a.start(p)
        b.start(p)
        assert a.propose(p, 5, 0.0, 0.0, None)[0].tolist() == b.propose(p, 5, 0.0, 0.0, None)[0].tolist()
