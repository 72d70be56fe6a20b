"""A batch-size schedule inside one run: γ goes to 0 (plain decoding) and back as the rows in flight
change (`batch.batch_generate(gamma_by_rows=...)`), on the shipped demo pair.

The closed loop refills a finished row at once, so the rows in flight only fall, when the queue runs
dry: 4 rows while there are requests, then 3, 2, 1. The schedule drafts γ 3 at 4 rows, nothing at
3 and 2 rows, γ 3 again at 1 row, so one run holds a switch to plain decoding and a return, and the
row still in flight at the return has decoded plain steps its draft model has not seen.

At T = 0 every row's output is the target's own greedy output, token for token, and at T > 0 the run
completes with valid output (the same seed, the same output). At both temperatures the acceptance
after the return is within noise of the acceptance before the switch, and the windows are long
enough that a draft accepting nothing after the return would fall outside. (They are not long
enough to catch a partial loss: a draft that read padding for the plain steps' tokens still
accepted 0.49 after the return against 0.60 before, z = 1.0; the windows hold different prompts'
tokens, and on this seed the acceptance after the return is 0.79, z = -2.0.)

"Within noise" is a two-proportion z-test, |z| <= Z_NOISE, of accepted / proposed draft tokens in
the two windows. The binomial variance p(1 - p) / n would treat every draft token as an independent
trial, but a step's tokens are accepted as a prefix (after a rejection the rest of the step is
rejected too), so tokens of one step are correlated and the binomial bound is too narrow. Each
window's variance is therefore taken over its steps, the ratio estimator's
Var(A / P) ~ sum((a_i - R p_i)^2) / P^2 (a_i accepted and p_i proposed in step i, R = A / P), which is
the binomial variance when every step proposes one token. Z_NOISE = 3.29 is a two-sided 0.1 % test:
the runs are seeded, so the test gives the same answer every time, and a false alarm would need a
one-in-a-thousand draw of the content.
"""

from __future__ import annotations

import math

import pytest
from helpers import check_rows

from specdec_tune.domain import DraftSpec
from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.caches.modes import ExecutionContext
from specdec_tune.runtime.decode import autoregressive_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.models.loading import eos_ids, load_model
from specdec_tune.runtime.workloads import Case, encode_prompts, load_workload

pytestmark = pytest.mark.slow  # the demo pair decodes a few hundred batched steps per run

ROWS, GAMMA = 4, 3
SCHEDULE = {4: GAMMA, 3: 0, 2: 0, 1: GAMMA}  # rows in flight -> γ of the step
Z_NOISE = 3.29  # two-sided 0.1 %
DRAFT = "draft-1l"
# Two waves of four rows (γ 3), then three rows (plain) of which the last decodes long after the
# others: alone again, it drafts again.
BUDGETS = [24] * 8 + [16, 16, 64]


@pytest.fixture(scope="module")
def demo():
    target = load_model("demo", "cpu")
    draft = load_model(DRAFT, "cpu")
    prompts = encode_prompts(load_workload("demo-code"), target.tokenizer)[: len(BUDGETS)]
    return target, draft, prompts


@pytest.fixture(scope="module")
def reference(demo):
    """The target's own greedy decoding of every prompt: one token a forward."""
    target, _, prompts = demo
    eos = eos_ids(target)
    return [
        autoregressive_generate(target.model, p, b, eos=eos).tokens
        for p, b in zip(prompts, BUDGETS, strict=True)
    ]


def _case(demo, temperature: float) -> Case:
    target, _, prompts = demo
    return Case(prompts, BUDGETS, eos_ids(target), temperature)


def _run(demo, case: Case, ctx: ExecutionContext, seed: int = 0):
    target, draft, _ = demo
    drafter = build_drafter(DraftSpec(DRAFT, "model"), target.model, {DRAFT: draft.model}, ctx, rows=ROWS)
    return batch_generate(
        target.model, drafter, case, ROWS, GAMMA, seed=seed, ctx=ctx, gamma_by_rows=SCHEDULE
    )


def windows(run) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """(proposed, accepted) per step: before the switch to plain, the plain steps, after the return."""
    phases: list[list[tuple[int, int]]] = [[], [], []]
    phase = 0
    for rows, gamma, proposed, accepted in run.per_step:
        assert gamma == SCHEDULE[rows]  # the step ran the schedule's γ for its rows in flight
        if phase == 0 and gamma == 0:
            phase = 1
        elif phase == 1 and gamma > 0:
            phase = 2
        assert phase != 1 or gamma == 0, "γ came back before the batch shrank to one row"
        phases[phase].append((proposed, accepted))
    return phases[0], phases[1], phases[2]


def acceptance(steps: list[tuple[int, int]]) -> tuple[float, float]:
    """Accepted / proposed over the window and its variance over steps (the ratio estimator's)."""
    proposed = sum(p for p, _ in steps)
    ratio = sum(a for _, a in steps) / proposed
    var = sum((a - ratio * p) ** 2 for p, a in steps) / proposed**2
    return ratio, var


def z_score(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> float:
    (r1, v1), (r2, v2) = acceptance(before), acceptance(after)
    return (r1 - r2) / math.sqrt(v1 + v2)


def check_transition(run) -> tuple[float, float, float]:
    """The switch and the return both happened, the plain steps drafted nothing, and the acceptance
    after the return is within noise of the one before; returns both and the z-score."""
    before, plain, after = windows(run)
    assert len(before) >= 10 and len(plain) >= 3 and len(after) >= 10, (len(before), len(plain), len(after))
    assert all(p == 0 for p, _ in plain)
    assert sum(p for p, _ in after) >= 3 * len(after) // 2  # the draft proposes again after the return
    z = z_score(before, after)
    assert abs(z) <= Z_NOISE, (acceptance(before), acceptance(after), z)
    # the windows are long enough for the bound to fail a draft that lost track (accepts nothing)
    assert z_score(before, [(p, 0) for p, _ in after]) > Z_NOISE
    return acceptance(before)[0], acceptance(after)[0], z


@pytest.mark.parametrize("mode", ["eager", "static"])
def test_greedy_through_a_switch_to_plain_and_back_is_the_targets_own(demo, reference, mode):
    target = demo[0]
    case = _case(demo, 0.0)
    run = _run(demo, case, ExecutionContext(mode, 256))
    assert check_rows(target.model, case, run.outputs, reference) == 0  # no row even at a near-tie
    before, after, _ = check_transition(run)
    assert before > 0.3 and after > 0.3  # the distilled draft is accepted on code


def test_sampling_through_a_switch_to_plain_and_back_completes_with_valid_output(demo):
    target, _, _ = demo
    case = _case(demo, 0.8)
    run = _run(demo, case, ExecutionContext("eager", 256), seed=5)
    vocab = target.model.config.vocab_size
    for out, budget in zip(run.outputs, BUDGETS, strict=True):
        assert 1 <= len(out) <= budget and all(0 <= t < vocab for t in out)
        assert not set(out[:-1]) & set(case.eos)  # an EOS ends its row
    check_transition(run)
    again = _run(demo, case, ExecutionContext("eager", 256), seed=5)
    assert again.outputs == run.outputs and again.per_step == run.per_step  # the seed decides it all


def test_a_schedule_gamma_above_the_runs_is_a_user_error(demo):
    with pytest.raises(SpecDecError, match=r"0\.\.3"):
        batch_generate(demo[0].model, None, _case(demo, 0.0), ROWS, GAMMA, gamma_by_rows={2: 4})
