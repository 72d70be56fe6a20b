"""The cost surface over batch sizes on tiny models: in-loop clocks only where the cost model reads
them (B > 1), and an envelope's longer length carrying its first length's loop terms instead of
running the batched loops again (measure.surface, measure.costs `carry`)."""

from __future__ import annotations

import pytest

from specdec_tune.domain import BatchCosts, Costs, DraftSpec
from specdec_tune.measure import costs as profiler
from specdec_tune.measure import forward, surface
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import ModelDrafter, PromptLookupDrafter
from specdec_tune.runtime.workloads import Case


@pytest.fixture(autouse=True)
def short_blocks(monkeypatch):
    # Timing quality is not under test here; short blocks keep the suite fast.
    monkeypatch.setattr(forward, "MIN_BLOCK_MS", 1.0)


def _makers(target, draft):
    specs = {"draft": DraftSpec("draft", "model"), "lookup": DraftSpec("lookup", "prompt_lookup")}
    return {
        name: (lambda b, spec=spec: build_drafter(spec, target, {"draft": draft}, None, rows=b))
        for name, spec in specs.items()
    }


def test_loops_are_clocked_above_batch_size_one_only(tiny_target, tiny_draft, prompts):
    case = Case(prompts[:3], [6, 6, 6], [], 0.0)
    rows, _ = surface.measure_surface(
        tiny_target, _makers(tiny_target, tiny_draft), [1, 2], 16, 3, repeats=1, case=case
    )
    one, two = rows
    # B = 1: the cost model reads the costs profile's own in-loop clocks (costmodel.in_loop)
    assert one.loop_overhead_ms is None and not one.loop_verify_ms and not one.step_overhead_ms
    assert set(two.loop_verify_ms) == {"draft", "lookup"} and two.loop_overhead_ms is not None
    assert two.loop_terms_from is None  # clocked here, not carried


def test_a_longer_length_carries_the_loop_terms_scaled(tiny_target, tiny_draft, prompts, monkeypatch):
    measured = BatchCosts(
        2, 1.0, [2.0, 3.0, 4.0], {"draft": 0.5, "lookup": 0.1},
        loop_overhead_ms=0.3, step_overhead_ms={"draft": 0.7, "lookup": 0.2},
        loop_verify_ms={"draft": 6.0, "lookup": 4.0}, loop_verify_tokens={"draft": 3.0, "lookup": 2.2},
        loop_t_draft_ms={"draft": 1.0},
    )  # fmt: skip

    first = Costs(1.0, 0.0, [1.0], 0.0, 16, batch=[measured])  # the first length's, at 16 tokens

    def no_loops(*args, **kwargs):
        raise AssertionError("the batched loops ran again at a carried length")

    monkeypatch.setattr(surface, "loop_costs", no_loops)
    case = Case(prompts[:3], [6, 6, 6], [], 0.0)
    rows, _ = surface.measure_surface(
        tiny_target, _makers(tiny_target, tiny_draft), [2], 24, 3, repeats=1, case=case,
        carry=first,
    )  # fmt: skip
    row = rows[0]
    assert row.loop_terms_from == 16
    # the loop's own work as it was; the forward and draft times as the micro-benchmarks moved
    assert row.loop_overhead_ms == 0.3 and row.step_overhead_ms == measured.step_overhead_ms
    assert row.loop_verify_tokens == measured.loop_verify_tokens
    assert row.loop_verify_ms["draft"] == pytest.approx(6.0 * row.verify_ms[1] / 3.0)  # width 2
    assert row.loop_verify_ms["lookup"] == pytest.approx(4.0 * row.verify_ms[0] / 2.0)  # width 1
    assert row.loop_t_draft_ms == {"draft": pytest.approx(1.0 * row.t_draft_ms["draft"] / 0.5)}

    # a batch size the first length never clocked is clocked at this one
    monkeypatch.undo()
    monkeypatch.setattr(forward, "MIN_BLOCK_MS", 1.0)
    rows, _ = surface.measure_surface(
        tiny_target, _makers(tiny_target, tiny_draft), [3], 24, 3, repeats=1, case=case,
        carry=first,
    )  # fmt: skip
    assert rows[0].loop_terms_from is None and set(rows[0].loop_verify_ms) == {"draft", "lookup"}


def test_costs_at_a_carried_length_measure_only_what_the_context_changes(
    tiny_target, tiny_draft, prompts, monkeypatch
):
    first = Costs(1.0, 0.0, [1.0, 1.0], 0.0, 16, copy_bandwidth_gbps=9.0, matmul_tflops=0.5,
                  loop_overhead_ms=0.25, step_overhead_ms=0.75)  # fmt: skip
    steps = []
    vector = profiler.acceptance_vector

    def counted(target, drafter, case, max_gamma, max_steps, ctx=None):
        steps.append(max_steps)
        return vector(target, drafter, case, max_gamma, max_steps, ctx)

    def no_overheads(*args, **kwargs):
        raise AssertionError("the loop overheads were measured again at a carried length")

    monkeypatch.setattr(profiler, "acceptance_vector", counted)
    monkeypatch.setattr(profiler, "measure_loop_overheads_ms", no_overheads)
    monkeypatch.setattr(profiler, "measure_copy_bandwidth_gbps", no_overheads)
    drafters = {"draft": ModelDrafter(tiny_draft), "lookup": PromptLookupDrafter()}
    costs = profiler.measure_costs(
        tiny_target, drafters, Case(prompts, [6] * len(prompts)), "cpu", max_gamma=2, repeats=1,
        context_len=24, carry=first,
    )  # fmt: skip
    assert costs.context_len == 24 and costs.t_target_ms > 0 and costs.t_target_ms != first.t_target_ms
    assert (costs.loop_overhead_ms, costs.step_overhead_ms) == (0.25, 0.75)
    assert (costs.copy_bandwidth_gbps, costs.matmul_tflops) == (9.0, 0.5)
    assert [d.name for d in costs.drafts] == ["draft", "lookup"]
    assert all(d.acceptance_known and len(d.acceptance_vector) == 2 for d in costs.drafts)
    assert steps == [profiler.CARRIED_ACCEPTANCE_STEPS] * 2
