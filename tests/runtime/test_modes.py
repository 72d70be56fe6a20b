"""Engine modes: under `static` and `compiled` every drafter's greedy output equals the same mode's
plain decoding and transformers.generate (batch 1 and batched, refill on, ragged acceptance, EOS
inside a draft), for a Llama, a GPT-2 and a Qwen2 (attention biases) architecture; sampling stays
exact (χ²); the static cache refuses what it cannot hold exactly; a compile failure falls back."""

from __future__ import annotations

import pytest
import torch
from helpers import check_rows, hf_greedy, noisy_copy, tiny_llama

from specdec_tune.domain import DraftSpec
from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.caches import modes, slots
from specdec_tune.runtime.caches.auto import resolve_auto
from specdec_tune.runtime.caches.modes import ExecutionContext
from specdec_tune.runtime.decode import autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.workloads import Case

VOCAB = 96


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=256,
        initializer_range=0.3,
        bos_token_id=0,
        eos_token_id=VOCAB - 1,
    )
    return GPT2LMHeadModel(cfg).eval()


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # the architecture under test
    return model


ARCHS = {"llama": lambda: tiny_llama(seed=0), "gpt2": tiny_gpt2, "qwen2": tiny_qwen2}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def pair(request):
    target = ARCHS[request.param]()
    return request.param, target, noisy_copy(target, 0.05)


def _case(target) -> Case:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB - 1, (n,), generator=g).tolist() for n in (5, 12, 3, 9, 2)]
    prompts.append([7, 8, 9, 7, 8, 9, 7, 8])  # repetitive: prompt lookup has matches
    budgets = [12, 7, 14, 5, 10, 12]
    eos = hf_greedy(target, prompts[0], 12, None)[5]  # a token the target emits mid-generation
    return Case(prompts, budgets, [eos], 0.0)


def _reference(target, case):
    return [hf_greedy(target, p, b, case.eos) for p, b in zip(case.prompts, case.max_new_tokens, strict=True)]


SPECS = {
    "model": DraftSpec("draft", "model"),
    "prompt_lookup": DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3),
    "layer_skip": DraftSpec("layer-skip-1", "layer_skip", layers=1),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["static", "eager"])
def test_static_mode_is_exact_for_every_architecture_and_drafter(pair, mode):
    arch, target, draft = pair
    case = _case(target)
    reference = _reference(target, case)
    ties = 0
    ctx = ExecutionContext(mode, 64)
    for b in (1, 3):
        plain = batch_generate(target, None, case, b, 0, ctx=ctx)
        ties += check_rows(target, case, plain.outputs, reference)
        for kind, spec in SPECS.items():
            if kind == "layer_skip" and arch == "gpt2":
                continue  # GPT-2 keeps its layers at transformer.h: layer-skip refuses it
            for gamma, threshold in ((1, 0.0), (3, 0.5), (6, 0.0)):
                drafter = build_drafter(spec, target, {"draft": draft}, ctx, rows=b)
                run = batch_generate(target, drafter, case, b, gamma, threshold, ctx=ctx)
                ties += check_rows(target, case, run.outputs, reference)
                assert run.stats.emitted == sum(map(len, run.outputs))
    # batch 1 through the one-sequence engine, its draft on the mode's cache too
    drafter = ModelDrafter(draft, lean=False, ctx=ctx)
    for prompt, budget, want in zip(case.prompts, case.max_new_tokens, reference, strict=True):
        alone = autoregressive_generate(target, prompt, budget, eos=case.eos, ctx=ctx)
        spec = speculative_generate(target, drafter, prompt, 4, 0.3, 0.0, budget, case.eos, ctx=ctx)
        assert alone.tokens == spec.tokens
        ties += check_rows(target, Case([prompt], [budget], case.eos, 0.0), [spec.tokens], [want])
    assert ties == 0


@pytest.mark.alone  # torch.compile builds on every core (tests/conftest.py)
@pytest.mark.slow
def test_compiled_mode_is_exact_and_builds_each_graph_once():
    target = tiny_llama(layers=1, hidden=32, seed=4)
    draft = tiny_gpt2(seed=2)  # a non-Llama draft runs on the compiled slot cache too
    case = _case(target)
    reference = _reference(target, case)
    mode = ExecutionContext("compiled", 64)
    drafter = build_drafter(DraftSpec("draft", "model"), target, {"draft": draft}, mode, rows=2)
    first = batch_generate(target, drafter, case, 2, 3, ctx=mode)
    plain = batch_generate(target, None, case, 2, 0, ctx=mode)
    built = slots.compile_events()
    again = batch_generate(target, drafter, case, 2, 3, ctx=mode)
    batch_generate(target, None, case, 2, 0, ctx=mode)
    assert slots.compile_events() == built  # shapes seen before: no recompile
    assert mode.fallbacks == []
    # GPT-2 and the Llama target share no vocabulary semantics, only ids: exactness still holds
    assert check_rows(target, case, first.outputs, reference) == 0
    assert again.outputs == first.outputs and plain.outputs == first.outputs
    assert first.stats.proposed > 0


def test_the_static_cache_moves_lengths_and_keeps_rows_apart():
    target = tiny_llama(seed=1)
    with torch.inference_mode():
        kv = slots.SlotCache(target, 2, 64)
        kv.prefill(0, [1, 2, 3, 4])
        kv.prefill(1, [9, 8, 7, 6, 5])
        tokens = torch.tensor([[5, 6, 7], [4, 0, 0]])
        kv.forward(tokens, torch.tensor([3, 1]))
        assert kv.lengths.tolist() == [7, 6]
        kv.truncate(torch.tensor([5, 6]))  # row 0 rejects two tokens: only its length moves
        got = kv.forward(torch.tensor([[8], [3]]), torch.tensor([1, 1]))[:, 0]
        want0 = target(input_ids=torch.tensor([[1, 2, 3, 4, 5, 8]])).logits[0, -1]
        want1 = target(input_ids=torch.tensor([[9, 8, 7, 6, 5, 4, 3]])).logits[0, -1]
    torch.testing.assert_close(got[0], want0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], want1, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # a statistical test
def test_static_sampling_is_exact_per_row():
    from test_batch import _first_two_tokens
    from test_sampling import P_PASS, chi2_p_value

    assert chi2_p_value(*_first_two_tokens(1500, ExecutionContext("static", 16))) > P_PASS


def test_what_the_static_cache_cannot_hold_is_a_clear_error():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=16,
        max_position_embeddings=256,
    )
    sliding = MistralForCausalLM(cfg).eval()
    with pytest.raises(SpecDecError, match="--engine eager"):
        slots.SlotCache(sliding, 1, 64)
    slots.SlotCache(sliding, 1, 16)  # a window no shorter than the sequence is full attention
    with pytest.raises(SpecDecError, match="positions"):
        slots.SlotCache(tiny_gpt2(), 1, 512)  # n_positions 256
    with pytest.raises(SpecDecError, match="unknown engine mode"):
        modes.check_engine_mode("turbo")
    with pytest.raises(SpecDecError, match="holds 8 positions"):
        slots.SlotCache(tiny_llama(), 1, 8).prefill(0, list(range(1, 12)))


def test_a_compile_failure_falls_back_to_static_and_is_recorded(monkeypatch):
    target = tiny_llama(layers=1, hidden=32, seed=4)

    def broken(fn, device):
        def run(*args, **kwargs):
            raise RuntimeError("inductor: no C++ compiler found\nmore detail")

        return run

    monkeypatch.setattr(slots, "_compile", broken)
    case = _case(target)
    mode = ExecutionContext("compiled", 64)
    with pytest.warns(UserWarning, match="falling back"):
        run = batch_generate(target, None, case, 2, 0, ctx=mode)
    assert mode.fallbacks == ["LlamaForCausalLM: RuntimeError: inductor: no C++ compiler found"]
    assert check_rows(target, case, run.outputs, _reference(target, case)) == 0


def test_auto_is_compiled_on_cuda_and_measured_on_cpu(tmp_path):
    assert resolve_auto("cuda:0").choice == "compiled"
    assert resolve_auto("cpu").choice == "eager"
    remembered = tmp_path / "auto.json"
    probe = tiny_llama(layers=1, hidden=32)
    first = resolve_auto("cpu", probe, remembered)
    assert first.choice in ("eager", "static") and first.reason == "measured"
    assert set(first.compared_ms) == {"eager", "static"} and all(v > 0 for v in first.compared_ms.values())
    assert "eager" in first.summary() and str(remembered) in first.summary()
    again = resolve_auto("cpu", probe, remembered)  # the file keeps the choice: nothing re-timed
    assert (again.choice, again.reason, again.compared_ms) == (first.choice, "remembered", {})


def test_auto_remembers_where_it_is_told_and_only_there(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    probe = tiny_llama(layers=1, hidden=32)
    choice = resolve_auto("cpu", probe)
    default = tmp_path / "xdg" / "specdec-tune" / "engine-auto.json"
    assert json.loads(default.read_text()) == {next(iter(json.loads(default.read_text()))): choice.choice}
    forced = tmp_path / "static.json"
    forced.write_text(json.dumps({k: "static" for k in json.loads(default.read_text())}))
    assert resolve_auto("cpu", probe, forced).choice == "static"
    assert not list(tmp_path.glob("*.tmp")) and not list(default.parent.glob("*.tmp"))


def test_a_static_context_changes_nothing_outside_what_it_is_passed_to(tiny_dirs):
    """The static crash of issue 19: a session's mode leaked into every later drafter and loop.
    Now a session's context reaches only what it is handed; the default stays eager."""
    from specdec_tune.runtime.session import load_models

    s = load_models(
        tiny_dirs["target"],
        [tiny_dirs["draft"]],
        tiny_dirs["workload"],
        4,
        engine_mode="static",
        lazy_drafts=True,
    )
    assert s.engine_mode == "static" and s.ctx.static and s.ctx.auto is None
    target = s.target.model
    loose = ModelDrafter(target, lean=False)
    loose.start([1, 2, 3])
    assert loose.cache.slots is None  # eager: built without a context
    bound = ModelDrafter(target, lean=False, ctx=s.ctx)
    bound.start([1, 2, 3])
    assert bound.cache.slots is not None
    assert ExecutionContext().mode == "eager"


def test_prompt_lookup_needs_no_cache_in_any_mode():
    target = tiny_llama(seed=2)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    a = speculative_generate(
        target, PromptLookupDrafter(), prompt, 3, max_new_tokens=10, ctx=ExecutionContext("static", 64)
    )
    b = speculative_generate(target, PromptLookupDrafter(), prompt, 3, max_new_tokens=10)
    assert a.tokens == b.tokens == hf_greedy(target, prompt, 10, None)


def test_loop_clocks_time_the_target_in_static_mode(tiny_target, tiny_draft, prompts):
    from specdec_tune.measure.surface import loop_costs

    case = Case(prompts[:3], [6, 6, 6], [], 0.0)
    spec = DraftSpec("draft", "model")
    ctx = ExecutionContext("static", 64)
    make = {"draft": lambda b: build_drafter(spec, tiny_target, {"draft": tiny_draft}, ctx, rows=b)}
    original = slots.SlotCache.forward
    out = loop_costs(tiny_target, make, case, 2, 2, repeats=1, ctx=ctx)
    assert slots.SlotCache.forward is original  # the clock is taken off again
    assert out["loop_verify_ms"]["draft"] > 0 and out["loop_overhead_ms"] >= 0
    assert 1 < out["loop_verify_tokens"]["draft"] <= 3  # gamma 2: [last, d1, d2] per row
