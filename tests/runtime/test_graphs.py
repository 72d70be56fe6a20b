"""Never time a compile: under `--engine compiled` every graph a timed pass can reach is built
before the timing starts (a non-Llama GPT-2 pair), and the widths each compiled cache needs."""

from __future__ import annotations

import pytest
import torch

from specdec_tune.domain import DraftSpec
from specdec_tune.measure import batched, bench, overheads
from specdec_tune.runtime.caches import slots
from specdec_tune.runtime.caches.modes import ExecutionContext
from specdec_tune.runtime.decode import autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import PromptLookupDrafter
from specdec_tune.runtime.graphs import GraphBuild, timed_without_compiles, widths_for
from specdec_tune.runtime.workloads import Case

VOCAB = 96
GAMMA = 4


def tiny_gpt2(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=128, initializer_range=0.3)
    return GPT2LMHeadModel(cfg).eval()


def test_widths_each_compiled_cache_needs():
    # the target decodes (1) and verifies gamma + 1 slots; a draft catches up at any width up to
    # gamma + 1 (its budget shrinks near a request's end)
    assert widths_for(True, [4]) == [1, 5]
    assert widths_for(True, [2, 4, 0]) == [1, 3, 5]
    assert widths_for(True, [0]) == [1]
    assert widths_for(False, [2, 4]) == [1, 2, 3, 4, 5]


def test_a_timing_that_built_a_graph_is_redone_and_counted(monkeypatch):
    events = iter([0, 2, 2, 2])  # first attempt: 2 graphs appeared; second: none
    monkeypatch.setattr("specdec_tune.runtime.graphs.compile_events", lambda: next(events))
    calls = []
    build = GraphBuild()
    assert timed_without_compiles(lambda: calls.append(1) or len(calls), build) == 2
    assert (build.in_timing, build.retimed) == (2, 1)
    assert build.as_dict()["graphs_in_timing"] == 2


def _watch_timing(monkeypatch, module, name: str = "interleaved") -> list[int]:
    """Graphs built inside each call of the module's `interleaved` (the timed region)."""
    seen: list[int] = []
    real = getattr(module, name)

    def watched(*args, **kwargs):
        before = slots.compile_events()
        out = real(*args, **kwargs)
        seen.append(slots.compile_events() - before)
        return out

    monkeypatch.setattr(module, name, watched)
    return seen


def _case() -> Case:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB - 1, (n,), generator=g).tolist() for n in (3, 11, 6, 8)]
    # the warm-up prompt has the shortest budget: other prompts end at other draft widths
    return Case(prompts, [3, 13, 9, 11], [], 0.0)


def _dynamo_only(monkeypatch) -> None:
    """torch.compile with dynamo's own backend: the same graphs, built in a fraction of the time.
    Which graphs exist (one per input width) is dynamo's doing; inductor only makes each slower to
    build (45 s for this test's 14 graphs on 2 cores). test_modes compiles with inductor itself."""
    monkeypatch.setattr(
        slots, "_compile", lambda fn, device: torch.compile(fn, dynamic=False, backend="eager")
    )


@pytest.mark.alone  # torch.compile builds on every core (tests/conftest.py)
@pytest.mark.slow
def test_no_compile_inside_a_timed_pass_compiled_gpt2(monkeypatch):
    _dynamo_only(monkeypatch)
    target, draft = tiny_gpt2(0), tiny_gpt2(1)
    ctx = ExecutionContext("compiled", 64)
    case = _case()
    seen = _watch_timing(monkeypatch, bench, "interleaved_parts")
    drafter = build_drafter(DraftSpec("draft", "model"), target, {"draft": draft}, ctx)
    m = bench.measure(target, drafter, GAMMA, 0.0, case, repeats=2, ctx=ctx)
    assert ctx.fallbacks == []  # really compiled, not fallen back to static
    assert seen == [0]  # one timed round, no graph built inside it
    assert m.build.graphs > 0 and m.build.seconds > 0 and m.build.in_timing == 0
    assert m.as_dict()["compile"]["graphs"] == m.build.graphs
    assert m.mismatches == 0
    # every width the draft can reach was built before timing, not only the warm-up prompt's
    draft_kv = ctx.caches[draft][1]
    assert draft_kv._graphs == set(range(1, GAMMA + 2))
    assert ctx.caches[target][1]._graphs == {1, GAMMA + 1}

    # batched: the same, at B = 2
    seen_b = _watch_timing(monkeypatch, batched)

    def make():
        return build_drafter(DraftSpec("draft", "model"), target, {"draft": draft}, ctx, rows=2)

    mb = batched.measure_batched(target, make, GAMMA, 0.0, case, 2, repeats=2, ctx=ctx)
    assert seen_b == [0]
    assert mb.build.in_timing == 0 and mb.mismatches == 0


def test_the_loop_clock_of_a_compiled_target_times_its_slot_calls_not_its_forward():
    # Static caches with the compiled engine's clock: the target's forward is never patched (a
    # compiled graph would trace the patch and recompile), its slot-cache calls are clocked.
    target = tiny_gpt2(0)
    ctx = ExecutionContext("static", 64)
    saved = (slots.SlotCache.forward, slots.SlotCache.prefill)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    drafter = PromptLookupDrafter(1, 3)
    with overheads.LoopClock(target, drafter, "cpu", compiled=True) as clock:
        assert "forward" not in vars(target)
        gen = speculative_generate(target, drafter, prompt, GAMMA, max_new_tokens=12, ctx=ctx)
    assert clock.verifies == gen.stats.target_forwards and clock.verify_ms > 0  # prefill left out
    assert clock.verify_tokens >= clock.verifies  # each verification fed at least one token
    with overheads.ForwardClock(target, "cpu", compiled=True) as fclock:
        autoregressive_generate(target, prompt, 5, ctx=ctx)
    with overheads.ForwardClock(target, "cpu") as eager:  # the model's forward, eager engine
        autoregressive_generate(target, prompt, 5)
    assert fclock.calls == eager.calls > 1 and fclock.ms > 0  # the prefill and every decode step
    assert (slots.SlotCache.forward, slots.SlotCache.prefill) == saved


@pytest.mark.alone  # torch.compile builds on every core (tests/conftest.py)
@pytest.mark.slow
def test_the_loop_overheads_never_recompile_a_compiled_target(monkeypatch):
    """A clock patched onto the target's forward made dynamo recompile every graph inside the
    timed region on each repeat (`profile --engine compiled` ran for many minutes)."""
    target = tiny_gpt2(0)
    ctx = ExecutionContext("compiled", 64)
    seen = _watch_timing(monkeypatch, overheads)
    loop, step = overheads.measure_loop_overheads_ms(target, 16, 2, repeats=2, new_tokens=6, ctx=ctx)
    assert ctx.fallbacks == [] and seen == [0]  # no graph built inside the timed region
    assert loop >= 0 and step >= 0 and "forward" not in vars(target)
    assert ctx.graphs_built == 2 and ctx.compile_s > 0  # widths 1 (decode) and 3 (verify), once each
