"""The decode anchor: its shape from a model, its steps, and its turn between the plain passes."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_llama

from specdec_tune.domain import DecodeAnchorSpec
from specdec_tune.measure import bench as measure_mod
from specdec_tune.measure import decode_anchor
from specdec_tune.measure.bench import measure
from specdec_tune.measure.decode_anchor import DecodeAnchor, spec_of, steps_for
from specdec_tune.runtime.decode import SpecStats
from specdec_tune.runtime.workloads import Case


def test_the_shape_is_every_weight_matrix_in_order_and_an_embedding_only_where_tied():
    model = tiny_llama(layers=2, hidden=64, vocab=96)
    spec = spec_of(model)
    # per layer: q (64x64), k and v (32x64: 2 of 4 heads), o (64x64), gate and up (128x64), down
    # (64x128); then the output layer. The input embedding is read a row per token: not counted.
    assert spec.matrices == [[64, 64, 4], [32, 64, 4], [128, 64, 4], [64, 128, 2], [96, 64, 1]]
    assert spec.dtype == "float32"
    model.lm_head.weight = model.model.embed_tokens.weight  # tied: the output layer, once
    assert spec_of(model).matrices == spec.matrices
    half = spec_of(tiny_llama(layers=1, hidden=64, vocab=96).to(torch.bfloat16))
    assert half.dtype == "bfloat16"
    two = torch.nn.Sequential(torch.nn.Linear(8, 10, bias=True), torch.nn.Linear(8, 10))
    assert spec_of(two).matrices == [[10, 8, 2]]  # the biases are no matrices; one shape twice
    with pytest.raises(ValueError, match="no weight matrices"):
        spec_of(torch.nn.LayerNorm(8))


def test_steps_are_decode_shaped_deterministic_and_bounded_in_memory(monkeypatch):
    spec = DecodeAnchorSpec([[96, 64, 1], [64, 64, 4], [128, 64, 2], [64, 128, 1]])
    a, b = DecodeAnchor(spec), DecodeAnchor(spec)
    assert a.matrices == 8 and a.bytes == 4 * (96 * 64 + 4 * 64 * 64 + 2 * 128 * 64 + 64 * 128)
    assert a.run(3) == 3 and b.run(3) == 3
    assert set(a.state) == {96, 64, 128}
    for n in a.state:  # same seed, same steps: the same state
        assert torch.equal(a.state[n], b.state[n]) and torch.isfinite(a.state[n]).all()
    # every output is normalised (a norm after each matrix): no overflow however many steps
    assert a.run(50) == 50 and all(torch.isfinite(v).all() for v in a.state.values())
    # Past the byte cap the anchor reuses matrices of a shape it made: as many matrices per step,
    # fewer distinct ones.
    monkeypatch.setattr(decode_anchor, "MAX_ANCHOR_BYTES", 4 * 64 * 64 * 2)
    capped = DecodeAnchor(DecodeAnchorSpec([[64, 64, 5]]))
    distinct = {id(w) for _, w in capped.order}
    assert capped.matrices == 5 and len(distinct) == 2 and capped.bytes == decode_anchor.MAX_ANCHOR_BYTES
    assert capped.run(2) == 2
    # a shape first met past the cap is still made (the step keeps every shape the target has)
    mixed = DecodeAnchor(DecodeAnchorSpec([[64, 64, 3], [32, 64, 2]]))
    assert mixed.matrices == 5 and len({id(w) for _, w in mixed.order}) == 3
    with pytest.raises(ValueError, match="not a torch dtype"):
        DecodeAnchor(DecodeAnchorSpec([[4, 4, 1]], "Tensor"))
    assert steps_for([10, 1, 33]) == [5, 1, 16]


def test_the_anchor_takes_its_turn_prompt_by_prompt_and_divides_the_plain_rate(monkeypatch, tiny_target):
    """measure(anchor=...) times the anchor between the plain and speculative parts of every
    prompt, and each repeat's plain tokens/s per anchor step/s is kept."""
    order = []

    def fake_prompt(target, drafter, gamma, threshold, c, i, generator=None, ctx=None):
        order.append(("plain" if gamma == 0 else "spec", i))
        return [1, 2, 3, 4], SpecStats()

    class Anchor:
        def run(self, steps):
            order.append(("anchor", steps))
            return steps

    monkeypatch.setattr(measure_mod, "run_pass", lambda *a, **k: ([[1]], SpecStats()))
    monkeypatch.setattr(measure_mod, "run_prompt", fake_prompt)
    c = Case([[1, 2], [3, 4]], [4, 10], [], 0.0)
    m = measure(tiny_target, object(), 2, 0.0, c, repeats=3, anchor=Anchor())
    assert order[0] == ("anchor", 1)  # the warm-up: a step, untimed
    timed = order[1:]
    assert len(timed) == 3 * 2 * 3
    # part by part: plain, speculative, anchor, reversed at every other part; steps per part
    # follow the part's new tokens (steps_for)
    assert timed[:6] == [("plain", 0), ("spec", 0), ("anchor", 2), ("anchor", 5), ("spec", 1), ("plain", 1)]
    assert len(m.anchor_rates) == 3 and len(m.plain_per_anchor) == 3
    for base, anchor, ratio in zip(m.baseline_rates, m.anchor_rates, m.plain_per_anchor, strict=True):
        assert ratio == pytest.approx(base / anchor)
    plain = measure(tiny_target, object(), 2, 0.0, c, repeats=2)
    assert plain.anchor_rates == [] and plain.plain_per_anchor == []


def test_a_real_anchor_beside_a_real_model(tiny_target, prompts):
    c = Case(prompts[:2], [6, 6], [], 0.0)
    m = measure(tiny_target, None, 0, 0.0, c, repeats=2, anchor=DecodeAnchor(spec_of(tiny_target)))
    assert len(m.plain_per_anchor) == 2 and all(x > 0 for x in m.plain_per_anchor)
    assert all(r > 0 for r in m.anchor_rates)
