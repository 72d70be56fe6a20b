"""transformers' assisted generation on our workload: the same greedy tokens and the same drafting."""

from __future__ import annotations

import pytest
from transformers.generation import candidate_generator

from specdec_tune.errors import SpecDecError
from specdec_tune.measure.bench import run_pass
from specdec_tune.measure.hfcompare import HFConfig, check_hf_layer_skip, measure_hf, run_hf_pass
from specdec_tune.runtime.workloads import Case

MAX_NEW = 16


@pytest.fixture(scope="module")
def case(prompts):
    return Case(prompts, [MAX_NEW] * len(prompts))


def ours(target, draft, case, kind, gamma=3, threshold=0.0, layers=None):
    drafter = HFConfig(kind, gamma, threshold, draft, 3, layers).drafter(target)
    return run_pass(target, drafter, gamma, threshold, case)


def hf_generate_kwargs(*args, **kwargs):
    return HFConfig(*args, **kwargs).generate_kwargs()


def hf_pass(target, case, *args, seed=0, **kwargs):
    return run_hf_pass(target, case, HFConfig(*args, **kwargs), seed)


def test_kwargs_mapping(tiny_draft):
    assert hf_generate_kwargs("none", 3, 0.5) == {}
    assert hf_generate_kwargs("model", 0, 0.0, tiny_draft) == {}  # gamma 0: plain decoding
    model = hf_generate_kwargs("model", 4, 0.0, tiny_draft)
    assert model.pop("assistant_model") is tiny_draft
    # The threshold is explicit even at 0: left unset, transformers would use 0.4.
    want = {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"}
    assert model == {**want, "assistant_confidence_threshold": 0.0}
    assert hf_generate_kwargs("prompt_lookup", 5, 0.3, ngram_max=2) == {
        "prompt_lookup_num_tokens": 5,
        "max_matching_ngram_size": 2,
    }
    skip = hf_generate_kwargs("layer_skip", 4, 0.5, layers=2)
    assert skip == {"assistant_early_exit": 2, **want, "assistant_confidence_threshold": 0.5}


@pytest.mark.parametrize(
    "args",
    [
        ("beam", 3, 0.0),
        ("model", 3, 0.0),  # no draft model
        ("layer_skip", 3, 0.0),  # no layer count
        ("prompt_lookup", 65, 0.0),
        ("prompt_lookup", 3, 1.0),
    ],
)
def test_bad_configs_are_user_errors(args):
    with pytest.raises(SpecDecError):
        hf_generate_kwargs(*args)


@pytest.mark.parametrize("kind", ["model", "prompt_lookup"])
@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_greedy_tokens_equal_ours(tiny_target, tiny_draft, case, kind, threshold):
    hf = hf_pass(tiny_target, case, kind, 3, threshold, tiny_draft)
    assert hf == ours(tiny_target, tiny_draft, case, kind, 3, threshold)[0]
    assert [len(t) for t in hf] == [MAX_NEW] * len(case.prompts)


def test_greedy_tokens_equal_ours_with_eos(tiny_target, tiny_draft, case):
    free = ours(tiny_target, None, case, "none")[0]
    eos_case = Case(case.prompts, case.max_new_tokens, eos=sorted({t[4] for t in free}))
    want = ours(tiny_target, None, eos_case, "none")[0]
    assert all(len(t) <= 5 for t in want)  # every prompt stops early, at an EOS
    for kind in ("none", "model", "prompt_lookup", "layer_skip"):
        assert hf_pass(tiny_target, eos_case, kind, 3, 0.0, tiny_draft, layers=1) == want, kind


def test_hf_drafts_and_verifies_like_we_do(tiny_target, tiny_draft, prompts):
    """With γ, the threshold and EOS really applied to HF's assistant, both make the same forwards."""
    case = Case(prompts, [24] * len(prompts))  # long enough for the draft to propose the model's EOS
    calls = {"target": 0, "draft": 0}
    hooks = [
        m.register_forward_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
        for k, m in (("target", tiny_target), ("draft", tiny_draft))
    ]
    try:
        verifies = {}
        for threshold in (0.0, 0.5):
            calls.update(target=0, draft=0)
            hf_pass(tiny_target, case, "model", 3, threshold, tiny_draft)
            hf_calls = dict(calls)
            stats = ours(tiny_target, tiny_draft, case, "model", 3, threshold)[1]
            assert hf_calls["target"] == stats.target_forwards  # HF folds the prefill into step 1
            assert hf_calls["draft"] == stats.proposed  # one draft forward per proposed token
            verifies[threshold] = stats.target_forwards
        assert verifies[0.5] > verifies[0.0]  # the threshold stopped drafting early
    finally:
        for h in hooks:
            h.remove()


def test_layer_skip(tiny_target, case):
    hf = hf_pass(tiny_target, case, "layer_skip", 3, 0.0, layers=1)
    assert hf == ours(tiny_target, None, case, "layer_skip", layers=1)[0]
    with pytest.raises(SpecDecError, match="layers"):
        check_hf_layer_skip(tiny_target, 3)


def test_layer_skip_unsupported_model_is_a_user_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32, n_positions=64)).eval()
    with pytest.raises(SpecDecError, match="no layer-skip"):
        hf_pass(gpt2, Case([[1, 2, 3]], [4]), "layer_skip", 3, 0.0, layers=1)


def test_generation_configs_are_restored_and_threshold_pinned(tiny_target, tiny_draft, prompts, monkeypatch):
    # As if scikit-learn were installed: HF would then re-tune the threshold (importing sklearn).
    monkeypatch.setattr(candidate_generator, "is_sklearn_available", lambda: True)
    sklearn_hook = candidate_generator.is_sklearn_available
    saved = {m: (m.generation_config, m.generation_config.to_dict()) for m in (tiny_target, tiny_draft)}
    hf_pass(tiny_target, Case(prompts, [24] * len(prompts)), "model", 3, 0.5, tiny_draft)
    small = Case([[5, 6, 7, 5, 6]], [6])
    hf_pass(tiny_target, small, "layer_skip", 2, 0.5, layers=1)
    for m, (config, as_dict) in saved.items():
        assert m.generation_config is config
        assert config.to_dict() == as_dict
    assert candidate_generator.is_sklearn_available is sklearn_hook


def test_sampling_pass_is_seeded(tiny_target, tiny_draft):
    sampled = Case([[1, 2, 3], [4, 5]], [8, 8], temperature=0.8)
    a = hf_pass(tiny_target, sampled, "model", 3, 0.0, tiny_draft, seed=3)
    b = hf_pass(tiny_target, sampled, "model", 3, 0.0, tiny_draft, seed=3)
    assert a == b
    assert [len(t) for t in a] == [8, 8]


@pytest.mark.parametrize("kind", ["model", "none"])
def test_measure_hf(tiny_target, tiny_draft, prompts, kind):
    small = Case(prompts[:2], [8, 8])
    got = measure_hf(tiny_target, small, HFConfig(kind, 3, 0.0, tiny_draft), repeats=2, warmup=1)
    assert got["ours_tokens_per_s"] > 0 and got["hf_tokens_per_s"] > 0
    assert got["ratio"] > 0 and got["ratio_spread"] >= 0
    assert len(got["ratios"]) == got["repeats"] == 2
    assert got["identical_tokens"] is True
    assert got["tokens_ours"] == got["tokens_hf"] == 16


def test_measure_hf_sampling_does_not_claim_identity(tiny_target, tiny_draft):
    sampled = Case([[1, 2, 3]], [6], temperature=1.0)
    got = measure_hf(tiny_target, sampled, HFConfig("model", 2, 0.0, tiny_draft), repeats=1, warmup=0)
    assert got["identical_tokens"] is None
    assert got["hf_tokens_per_s"] > 0
    with pytest.raises(SpecDecError, match="repeats"):
        measure_hf(tiny_target, sampled, HFConfig("model", 2, 0.0, tiny_draft), repeats=0)


@pytest.mark.slow  # a statistical test
def test_sampling_verifies_on_the_same_distribution(tiny_target):
    """HF's default top-k 50 would cut the target's tail; the pass must switch it off."""
    vocab = tiny_target.config.vocab_size
    sampled = Case([[1]], [1], temperature=50.0)  # nearly uniform: top-50 of 96 would show at once
    seen = {hf_pass(tiny_target, sampled, "none", 0, 0.0, seed=s)[0][0] for s in range(400)}
    assert len(seen) > 50 and max(seen) < vocab
