"""The batched engine: every row's greedy output equals that prompt's batch-1 output from
transformers.generate (refill on, every drafter, ragged acceptance), sampling is exact per row (χ²),
and the row cache keeps rows apart through rollback, refill and compaction."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import check_rows, hf_greedy, noisy_copy, tiny_llama
from test_sampling import P_FAIL, P_PASS, _resample_from_p, chi2_p_value

from specdec_tune.domain import DraftSpec
from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.caches.rowcache import RowCache
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.workloads import Case

DRAFTS = {
    "model": DraftSpec("draft", "model"),
    "prompt_lookup": DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3),
    "layer_skip": DraftSpec("layer-skip-1", "layer_skip", layers=1),
    # the engines' own policies (export): earliest n-gram match, llama.cpp's top-k-10 p-min
    "prompt_lookup_earliest": DraftSpec(
        "prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3, lookup_match="earliest"
    ),
    "model_topk10": DraftSpec("draft", "model", threshold_mode="topk10"),
}


@pytest.fixture(scope="module")
def workload(tiny_target, prompts):
    """Prompts of different lengths (one of them repetitive), different budgets, and an EOS id
    that the target really emits mid-generation, so some rows stop inside an accepted draft."""
    g = torch.Generator().manual_seed(3)
    extra = [torch.randint(1, 95, (n,), generator=g).tolist() for n in (3, 17, 8, 2)]
    all_prompts = prompts + extra
    budgets = [16, 9, 20, 5, 12, 16, 3, 14, 18][: len(all_prompts)]
    probe = hf_greedy(tiny_target, all_prompts[2], 20, None)
    eos = probe[7]  # a token the target emits: generations containing it stop there
    return Case(all_prompts, budgets, [eos], 0.0)


@pytest.fixture(scope="module")
def reference(tiny_target, workload):
    return [
        hf_greedy(tiny_target, p, b, workload.eos)
        for p, b in zip(workload.prompts, workload.max_new_tokens, strict=True)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_plain_batched_decoding_equals_generate(tiny_target, workload, reference, batch_size, ctx):
    run = batch_generate(tiny_target, None, workload, batch_size, 0, ctx=ctx)
    assert check_rows(tiny_target, workload, run.outputs, reference) == 0
    assert run.stats.proposed == 0 and run.stats.emitted == sum(map(len, reference))
    assert len(run.latencies_s) == len(workload.prompts) and all(t > 0 for t in run.latencies_s)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DRAFTS))
@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_speculative_rows_equal_generate(tiny_target, tiny_draft, workload, reference, kind, batch_size, ctx):
    spec = DRAFTS[kind]
    thresholds = (0.0,) if kind.startswith("prompt_lookup") else (0.0, 0.5)
    ties = 0
    for gamma in (1, 2, 3, 5, 8):
        for threshold in thresholds:
            drafter = build_drafter(spec, tiny_target, {"draft": tiny_draft}, ctx, rows=batch_size)
            run = batch_generate(tiny_target, drafter, workload, batch_size, gamma, threshold, ctx=ctx)
            ties += check_rows(tiny_target, workload, run.outputs, reference)
            assert run.stats.proposed > 0 or kind.startswith("prompt_lookup")
            assert run.stats.emitted == sum(map(len, run.outputs))
    assert ties == 0  # expected on these models; a proven near-tie would be allowed and counted


def test_more_rows_than_prompts_and_a_one_token_prompt(tiny_target, tiny_draft):
    case = Case([[7], [3, 4, 5]], [6, 4], [], 0.0)
    want = [
        hf_greedy(tiny_target, p, b, None) for p, b in zip(case.prompts, case.max_new_tokens, strict=True)
    ]
    drafter = build_drafter(DRAFTS["model"], tiny_target, {"draft": tiny_draft}, rows=5)
    assert batch_generate(tiny_target, drafter, case, 5, 3).outputs == want


def test_row_cache_keeps_rows_apart_through_rollback_refill_and_compaction(tiny_target):
    """Row 1's logits must not change whatever happens to row 0 (rollback, refill, compaction)."""
    kv = RowCache(tiny_target, 2)
    kv.prefill(0, [1, 2, 3])
    kv.prefill(1, [9, 8, 7, 6, 5])
    probe = torch.tensor([[0], [4]])
    one = torch.tensor([0, 1])
    with torch.inference_mode():
        for _ in range(3):  # row 0 grows and rolls back, leaving holes behind
            kv.forward(torch.tensor([[11, 12, 13], [0, 0, 0]]), torch.tensor([3, 0]))
            kv.truncate(torch.tensor([3, 5]))
        kv.prefill(0, [21, 22, 23, 24, 25, 26, 27])  # refill, longer than before
        got = kv.forward(probe, one)[1, 0]
        kv.truncate(kv.lengths - one)
        kv.compact()
        assert kv.width == 7
        after = kv.forward(probe, one)[1, 0]
        alone = tiny_target(input_ids=torch.tensor([[9, 8, 7, 6, 5, 4]])).logits[0, -1]
    torch.testing.assert_close(got, alone, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after, alone, rtol=1e-4, atol=1e-4)


def test_bad_batch_input_is_a_user_error(tiny_target):
    case = Case([[1, 2]], [4], [], 0.0)
    with pytest.raises(SpecDecError, match="batch size"):
        batch_generate(tiny_target, None, case, 0, 0)
    with pytest.raises(SpecDecError, match="empty"):
        batch_generate(tiny_target, None, Case([[]], [4], [], 0.0), 2, 0)


def _first_two_tokens(n: int = 3000, ctx=None, device: str = "cpu"):
    """Temperature 1, a noisy draft, γ 2, four rows: the counts of each request's first two tokens
    and the target's exact joint distribution of them (computed on the CPU, in float64), the
    engine run on `device`."""
    vocab = 8
    target = tiny_llama(layers=1, hidden=16, vocab=vocab, seed=5, init=0.8)
    draft = noisy_copy(target, 0.03, seed=6)
    prompt = [1, 2, 3]
    with torch.inference_mode():
        p1 = torch.softmax(target(input_ids=torch.tensor([prompt])).logits[0, -1].double(), -1)
        p2 = torch.softmax(
            target(input_ids=torch.tensor([[*prompt, t] for t in range(vocab)])).logits[:, -1].double(), -1
        )
    probs = {(a, b): float(p1[a] * p2[a, b]) for a in range(vocab) for b in range(vocab)}
    target, draft = target.to(device), draft.to(device)
    case = Case([prompt] * n, [3] * n, [], 1.0)  # a budget of 3 lets the first step draft 2
    drafter = build_drafter(DraftSpec("draft", "model"), target, {"draft": draft}, ctx, rows=4)
    run = batch_generate(target, drafter, case, 4, 2, seed=11, ctx=ctx)
    assert 0.1 < run.stats.acceptance_rate < 0.95  # both branches of the verifier are taken
    return Counter(tuple(o[:2]) for o in run.outputs), probs


@pytest.mark.slow
def test_batched_sampling_is_exact_per_row():
    assert chi2_p_value(*_first_two_tokens()) > P_PASS


@pytest.mark.slow
def test_batched_sampling_test_catches_a_biased_verifier(monkeypatch):
    from specdec_tune.runtime import batch

    monkeypatch.setattr(batch, "verify_sampling", _resample_from_p)
    assert chi2_p_value(*_first_two_tokens()) < P_FAIL


def test_steady_state_ends_when_the_queue_runs_dry(tiny_target):
    """Throughput at B counts only the window in which all B slots were busy."""
    case = Case([[3, 4, 5]] * 5, [4, 4, 4, 4, 12], [], 0.0)
    run = batch_generate(tiny_target, None, case, 2, 0)
    total = sum(map(len, run.outputs))
    # Requests 0-3 finish two by two; the queue runs dry when request 4's partner finishes, and
    # request 4 then decodes alone: its tail is not in the steady window.
    assert 0 < run.steady_tokens < total and run.steady_s > 0
    assert run.steady_tokens <= total - (12 - 4)
    # Fewer requests than slots: there is no steady state, the whole run counts.
    few = batch_generate(tiny_target, None, Case([[3, 4]], [5], [], 0.0), 4, 0)
    assert few.steady_tokens == 5
