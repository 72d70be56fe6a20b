"""The engine on CUDA with real weights: the shipped demo pair decoded in the eager, static and
compiled engine modes, every row's greedy output the target's own, token for token (compiled: the
target's and the draft's forwards in CUDA graphs, `leandraft.runs_lean` false), and speculative
sampling exact per row on CUDA (the χ² test of tests/runtime/test_batch.py, run there).

`pytest -m cuda` selects these; without a GPU they skip with one line. `benchmarks/gpu.sh` runs them
first on a GPU box (docs/gpu.md). Float32, so that exactness is the engine's and not bfloat16's
rounding; as on the CPU, a row may differ only at a proven near-tie of the target
(`helpers.near_tie`), which the test counts and reports.
"""

from __future__ import annotations

import pytest
import torch
from helpers import check_rows
from test_batch import _first_two_tokens
from test_sampling import P_FAIL, P_PASS, chi2_p_value

from specdec_tune.domain import DraftSpec
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.caches.modes import ExecutionContext
from specdec_tune.runtime.decode import autoregressive_generate, speculative_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.drafting.drafters import ModelDrafter
from specdec_tune.runtime.drafting.leandraft import runs_lean
from specdec_tune.runtime.models.loading import eos_ids, load_model
from specdec_tune.runtime.workloads import Case, encode_prompts, load_workload

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is false)"
    ),
]

DEVICE, DTYPE, DRAFT = "cuda", "float32", "draft-1l"
BUDGETS = [32, 24, 40, 16, 32, 24]
# (rows, γ, threshold) per mode; compiled builds a CUDA graph per (model, rows, width), so it runs
# the fewest shapes: 3 rows, γ 3 (target widths 1 and 4, the draft's 1 and 4) and plain decoding.
RUNS = {
    "eager": [(1, 3, 0.0), (3, 3, 0.0), (3, 5, 0.4)],
    "static": [(1, 3, 0.0), (3, 3, 0.0), (3, 5, 0.4)],
    "compiled": [(3, 3, 0.0)],
}


@pytest.fixture(scope="module")
def demo():
    target = load_model("demo", DEVICE, DTYPE)
    draft = load_model(DRAFT, DEVICE, DTYPE)
    prompts = encode_prompts(load_workload("demo-code"), target.tokenizer)[: len(BUDGETS)]
    case = Case(prompts, BUDGETS, eos_ids(target), 0.0)
    # the target's own greedy decoding: one token a forward, eager
    reference = [
        autoregressive_generate(target.model, p, b, eos=case.eos).tokens
        for p, b in zip(prompts, BUDGETS, strict=True)
    ]
    return target, draft, case, reference


@pytest.mark.parametrize("mode", sorted(RUNS))
def test_the_demo_pair_on_cuda_decodes_the_targets_own_greedy_output(demo, mode):
    target, draft, case, reference = demo
    ctx = ExecutionContext(mode, 256, DEVICE, DTYPE)
    ties = 0
    plain = batch_generate(target.model, None, case, 3, 0, ctx=ctx)
    ties += check_rows(target.model, case, plain.outputs, reference)
    for rows, gamma, threshold in RUNS[mode]:
        drafter = build_drafter(DraftSpec(DRAFT, "model"), target.model, {DRAFT: draft.model}, ctx, rows=rows)
        # compiled on CUDA: the draft runs in CUDA graphs over a compiled slot cache, not the lean forward
        assert runs_lean(draft.model, ctx) is (mode != "compiled")
        assert getattr(drafter.kv, "compiled", False) is (mode == "compiled")
        run = batch_generate(target.model, drafter, case, rows, gamma, threshold, ctx=ctx)
        ties += check_rows(target.model, case, run.outputs, reference)
        assert run.stats.proposed > 0 and run.stats.acceptance_rate > 0.3, run.stats
    if mode != "compiled":  # the one-sequence engine, its draft on the mode's cache
        drafter = ModelDrafter(draft.model, ctx=ctx)
        for prompt, budget, want in zip(case.prompts, BUDGETS, reference, strict=True):
            got = speculative_generate(target.model, drafter, prompt, 4, 0.0, 0.0, budget, case.eos, ctx=ctx)
            ties += check_rows(target.model, Case([prompt], [budget], case.eos, 0.0), [got.tokens], [want])
    assert ctx.fallbacks == []  # compiled really compiled: no fallback to static
    assert ctx.graphs_built > 0 if mode == "compiled" else ctx.graphs_built == 0
    assert ties <= 1, f"{ties} rows differ at near-ties of the target"


@pytest.mark.parametrize("mode", sorted(RUNS))
def test_speculative_sampling_on_cuda_is_exact_per_row(mode):
    """χ² of each request's first two tokens against the target's exact joint, p > P_PASS."""
    ctx = ExecutionContext(mode, 16, DEVICE, DTYPE)
    assert chi2_p_value(*_first_two_tokens(1500, ctx, DEVICE)) > P_PASS


def _resample_from_p(logits, draft, q, temperature, generator):
    """test_sampling's planted bug (a rejection resamples from p, not the residual), on p's device."""
    p = torch.softmax(logits.float() / temperature, -1)
    k, idx = draft.numel(), torch.arange(draft.numel(), device=p.device)
    q_tok = q[idx, draft] if q is not None else torch.ones(k, device=p.device)
    u = torch.rand(k, generator=generator, device=p.device)
    n = int((u * q_tok < p[idx, draft]).cumprod(0).sum())
    return n, [*draft[:n].tolist(), int(torch.multinomial(p[n], 1, generator=generator))]


def test_the_sampling_test_on_cuda_catches_a_biased_verifier(monkeypatch):
    from specdec_tune.runtime import batch

    monkeypatch.setattr(batch, "verify_sampling", _resample_from_p)
    ctx = ExecutionContext("eager", 16, DEVICE, DTYPE)
    assert chi2_p_value(*_first_two_tokens(3000, ctx, DEVICE)) < P_FAIL
