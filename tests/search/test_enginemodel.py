"""The engine's cost model against fabricated per-request counters: exact ones made from known
parameters (token share q, per-position acceptance alpha, k and c in ms, t_plain, t_draft), which it
must recover, and a seeded token-level walk of an n-gram draft over text with copied stretches."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from specdec_tune.domain import Config, DraftSpec
from specdec_tune.measure.llamacpp.counters import RequestStats
from specdec_tune.search.enginefit import expected_accepted, fit_alpha, identified, nnls
from specdec_tune.search.enginemodel import EngineCostModel, Observation, observations

LOOKUP = DraftSpec("ngram-simple:4", "prompt_lookup", ngram_min=4, ngram_max=4, lookup_match="latest")
MOD = DraftSpec("ngram-mod:24", "ngram_mod", ngram_max=24, min_draft=1)
DRAFT = DraftSpec("demo-draft", "model", path="d.gguf", threshold_mode="topk10")
T_PLAIN = 11.0


@dataclass
class Counts:
    """A request's counters as exact expectations (floats: no rounding in the recovery tests)."""

    predicted_n: float
    predicted_ms: float
    draft_n: float = 0.0
    draft_accepted: float = 0.0


def truth(gamma, q, alpha, k, c, t_plain=T_PLAIN, t_draft=0.0):
    """Per decode token: (ms, forwards, drafted, accepted) of the model's equations."""
    acc = expected_accepted(alpha, gamma)
    steps = q / (1 + acc)
    forwards = 1 - q + steps
    drafted = gamma * steps
    ms = forwards * t_plain + steps * c + drafted * k + t_draft * (forwards + drafted)
    return ms, forwards, drafted, acc * steps


def fabricate(config, q, alpha, k, c=0.0, t_draft=0.0, t_plain=T_PLAIN, vary=True):
    """One observation: 6 prompts of 100..350 decode tokens, each with its own share of copied
    text (q varies by prompt, around `q`, unless not `vary`), and the interleaved plain requests."""
    spec, plain = [], []
    for i in range(6):
        n = 100.0 + 50 * i
        qi = min(1.0, q * (0.6 + 0.16 * i)) if vary else q
        ms, _, drafted, accepted = truth(config.gamma, qi, alpha, k, c, t_plain, t_draft)
        spec.append(Counts(n + 1, n * ms, n * drafted, n * accepted))
        plain.append(Counts(n + 1, n * t_plain))
    return Observation(config, spec, plain)


def speedup(gamma, q, alpha, k, c=0.0, t_draft=0.0, vary=True):
    """The truth's speedup for fabricate's prompts (q per prompt as there)."""
    spec = plain = 0.0
    for i in range(6):
        n = 100.0 + 50 * i
        qi = min(1.0, q * (0.6 + 0.16 * i)) if vary else q
        spec += n * truth(gamma, qi, alpha, k, c, t_draft=t_draft)[0]
        plain += n * T_PLAIN
    return plain / spec


def lookup_model(gammas=(4, 8, 12), q=0.3, alpha=0.75, k=0.9, c=0.4):
    return EngineCostModel(fabricate(Config(LOOKUP, g), q, alpha, k, c) for g in gammas)


def test_the_fit_recovers_every_parameter_it_was_made_from():
    m = lookup_model().fit()
    fit = m.drafts[("ngram-simple:4", 0.0)]
    assert m.t_plain_ms == pytest.approx(T_PLAIN)
    assert fit.alpha == pytest.approx(0.75, abs=1e-6)
    # q is pooled over prompts, weighted by their tokens
    pooled = sum((100 + 50 * i) * 0.3 * (0.6 + 0.16 * i) for i in range(6)) / sum(
        100 + 50 * i for i in range(6)
    )
    assert fit.token_share == pytest.approx(pooled)
    v = m.verify["ngram"]
    assert v.step_identified
    assert v.ms_per_token == pytest.approx(0.9, rel=1e-6)
    assert v.ms_per_step == pytest.approx(0.4, rel=1e-5)
    for g in (4, 8, 12):
        p = m.breakdown(Config(LOOKUP, g))
        _, forwards, drafted, _ = truth(g, pooled, 0.75, 0.9, 0.4)
        assert p.coverage == pytest.approx(drafted / g / forwards)
        assert p.speedup == pytest.approx(speedup(g, 0.3, 0.75, 0.9, 0.4), rel=2e-3)
    e = m.errors()
    assert e.count == 3 and e.worst < 2e-3 and e.median < 2e-3


def test_an_unmeasured_gamma_is_predicted_from_the_measured_ones():
    m = lookup_model(gammas=(4, 8))
    for g in (2, 12, 16, 24):
        assert m.predict(Config(LOOKUP, g)) == pytest.approx(speedup(g, 0.3, 0.75, 0.9, 0.4), rel=2e-3)
    assert "measured at γ 4, 8" in m.explain(Config(LOOKUP, 16))
    # one gamma cannot tell c from k: c folds into k there, and that gamma is still exact
    one = lookup_model(gammas=(12,)).fit()
    v = one.verify["ngram"]
    assert not v.step_identified and v.ms_per_step == 0.0
    assert v.ms_per_token == pytest.approx(0.9 + 0.4 / 12, rel=1e-6)
    assert one.predict(Config(LOOKUP, 12)) == pytest.approx(speedup(12, 0.3, 0.75, 0.9, 0.4), rel=2e-3)


def test_rank_puts_the_best_gamma_first_and_explain_says_why():
    m = lookup_model()
    configs = [Config(LOOKUP, g) for g in range(1, 33)]
    ranked = m.rank(configs)
    truths = {g: speedup(g, 0.3, 0.75, 0.9, 0.4) for g in range(1, 33)}
    assert ranked[0][0].gamma == max(truths, key=truths.get)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    line = m.explain(Config(LOOKUP, 12))
    assert line.startswith("ngram-simple:4 γ=12: ")
    assert "% of forwards" in line and "accepted of 12" in line and "ms per drafted token" in line
    assert "+ 0.40 ms per draft" in line and f"T_target {T_PLAIN:.1f} ms" in line
    assert "≥" not in line  # ngram-simple drafts gamma tokens: its coverage is not a bound


def test_a_model_draft_with_high_acceptance_still_loses_to_its_cost():
    obs = [fabricate(Config(LOOKUP, g), 0.3, 0.75, 0.9, 0.4) for g in (4, 8)]
    # the draft model drafts on almost every forward and is accepted 90 % per token, but one draft
    # forward costs 60 % of a target forward
    obs += [fabricate(Config(DRAFT, g, 0.3), 0.95, 0.9, 0.9, t_draft=6.6) for g in (3, 6)]
    m = EngineCostModel(obs).fit()
    assert m.t_draft_ms["demo-draft"] == pytest.approx(6.6, rel=1e-6)
    assert m.verify["model"].ms_per_token == pytest.approx(0.9, rel=1e-5)
    p = m.breakdown(Config(DRAFT, 4, 0.3))
    assert p.accepted_per_draft > 2.9 and p.coverage > 0.7
    assert p.speedup < 1.0
    assert p.speedup == pytest.approx(speedup(4, 0.95, 0.9, 0.9, t_draft=6.6), rel=2e-3)
    ranked = m.rank([Config(DRAFT, 4, 0.3), Config(LOOKUP, 8)])
    assert [c.draft.name for c, _ in ranked] == ["ngram-simple:4", "demo-draft"]
    assert "draft model 6.60 ms per forward" in m.explain(Config(DRAFT, 4, 0.3))


def test_a_draft_model_measured_once_takes_the_n_gram_k():
    obs = [fabricate(Config(LOOKUP, g), 0.3, 0.75, 0.9) for g in (4, 8)]
    # every prompt drafts on the same share of forwards: D and F + D cannot tell k from t_draft
    obs.append(fabricate(Config(DRAFT, 4, 0.3), 0.9, 0.8, 0.9, t_draft=2.0, vary=False))
    m = EngineCostModel(obs).fit()
    assert m.verify["model"].borrowed_from == "ngram"
    assert m.t_draft_ms["demo-draft"] == pytest.approx(2.0, rel=1e-5)
    truth7 = speedup(7, 0.9, 0.8, 0.9, t_draft=2.0, vary=False)
    assert m.predict(Config(DRAFT, 7, 0.3)) == pytest.approx(truth7, rel=2e-3)
    line = m.explain(Config(DRAFT, 7, 0.5))
    assert "verification cost from the ngram drafts" in line and "acceptance from t=0.30" in line


def test_drafts_never_measured_get_no_prediction_and_say_so():
    m = lookup_model()
    other = Config(DraftSpec("ngram-simple:6", "prompt_lookup", ngram_min=6, ngram_max=6), 8)
    assert m.predict(other) is None and m.tokens_per_s(other) is None
    assert "ngram-simple:6 never measured in the engine" in m.explain(other)
    assert m.predict(Config(DRAFT, 4, 0.3)) is None
    assert m.rank([other, Config(LOOKUP, 8)])[0][0].draft.name == "ngram-simple:4"
    assert len(m.rank([other])) == 0
    assert m.predict(Config(LOOKUP, 0)) == 1.0
    assert m.tokens_per_s(Config(LOOKUP, 0)) == pytest.approx(1000 / T_PLAIN)
    assert "no 'heuristic' gamma policy" in m.explain(Config(LOOKUP, 8, gamma_policy="heuristic"))
    empty = EngineCostModel()
    assert empty.predict(Config(LOOKUP, 8)) is None
    assert "no plain timings yet" in empty.explain(Config(LOOKUP, 8))
    assert empty.errors().count == 0 and empty.errors().median is None


def test_adding_observations_refits():
    m = EngineCostModel()
    m.add(fabricate(Config(LOOKUP, 12), 0.3, 0.75, 0.9, 0.4))
    assert not m.fit().verify["ngram"].step_identified
    m.add(fabricate(Config(LOOKUP, 4), 0.3, 0.75, 0.9, 0.4))
    assert m.predict(Config(LOOKUP, 8)) == pytest.approx(speedup(8, 0.3, 0.75, 0.9, 0.4), rel=2e-3)


def test_a_variable_length_draft_says_its_coverage_is_a_bound():
    m = EngineCostModel([fabricate(Config(MOD, g), 0.4, 0.6, 0.9) for g in (8, 16)])
    line = m.explain(Config(MOD, 12))
    assert "drafts on ≥ " in line and "accepted of ≤ 12" in line


def test_errors_are_median_and_worst_relative_error():
    m = lookup_model()
    pairs = [(Config(LOOKUP, g), speedup(g, 0.3, 0.75, 0.9, 0.4)) for g in (4, 8, 12)]
    pairs[1] = (pairs[1][0], pairs[1][1] * 1.25)  # measured 25 % above what the model says
    e = m.errors(pairs)
    assert e.count == 3 and e.median < 2e-3
    assert e.worst == pytest.approx(1 - 1 / 1.25, rel=1e-2) and e.worst_config == "ngram-simple:4 γ=8"
    assert m.errors([(Config(DRAFT, 4, 0.3), 1.2)]).count == 0  # not predicted: not counted


def walk(gamma, seed, alpha=0.8, k=0.9, c=0.5, n=300, t_plain=T_PLAIN):
    """One request of an ngram-simple-like draft, token by token: the text (the same at every
    gamma, as at temperature 0) alternates free stretches and copied ones (their lengths about
    geometric); a forward in a copied stretch drafts gamma tokens (fewer before the budget's end,
    as the server caps them), each accepted with probability alpha while the earlier ones were
    and the stretch goes on (past its end the copy no longer matches)."""
    text = random.Random(seed)
    copied, pos = [], 0
    while pos < n:
        free, copy = int(text.expovariate(1 / 15)) + 1, int(text.expovariate(1 / 40)) + 1
        copied += [False] * free + [True] * copy
        pos += free + copy
    rng = random.Random(1000 * seed + gamma)
    p = forwards = steps = drafted = accepted = 0
    while p < n:
        length = min(gamma, n - p - 1) if copied[p] else 0
        acc = 0
        while acc < length and copied[p + acc + 1] and rng.random() < alpha:
            acc += 1
        forwards += 1
        steps += length > 0
        drafted += length
        accepted += acc
        p += 1 + acc
    ms = (forwards * t_plain + steps * c + drafted * k) * (1 + rng.gauss(0, 0.005))
    spec = RequestStats("spec", n + 1, ms, drafted, accepted, n + 1)
    plain = RequestStats("plain", n + 1, n * t_plain * (1 + rng.gauss(0, 0.005)), n_predict=n + 1)
    return spec, plain


@dataclass
class FakeMeasurement:
    requests: list


def walked(gamma, prompts=40):
    reqs = [r for s in range(prompts) for r in walk(gamma, s)]
    reqs.append(RequestStats("spec", 65, 1.0, 60, 0, 65, batch_size=4))  # B = 4: never fitted
    return Config(LOOKUP, gamma), FakeMeasurement(reqs)


def test_a_token_level_walk_is_predicted_at_gammas_it_never_measured():
    m = EngineCostModel(observations([walked(g) for g in (3, 6, 10)])).fit()
    assert all(len(o.spec) == 40 and len(o.plain) == 40 for o in m.observations)
    fit, v = m.drafts[("ngram-simple:4", 0.0)], m.verify["ngram"]
    # a token is accepted with probability 0.8 while its stretch goes on (1 - 1/40.5 of the time)
    assert fit.alpha == pytest.approx(0.8 * (1 - 1 / 40.5), abs=0.02)
    assert fit.token_share == pytest.approx(0.7, abs=0.02)  # copied stretches: 40.5 of 55.5 tokens
    assert v.ms_per_token == pytest.approx(0.9, rel=0.05) and v.ms_per_step == pytest.approx(0.5, rel=0.15)
    assert m.errors().worst < 0.01
    for g in (1, 2, 8, 16, 24):
        o = Observation.from_measurement(*walked(g))
        assert m.predict(o.config) == pytest.approx(o.measured_speedup, rel=0.03)


def test_the_estimators():
    assert fit_alpha([(12, expected_accepted(0.7, 12), 1.0)]) == pytest.approx(0.7, abs=1e-6)
    assert fit_alpha([(4, 4.0, 1.0)]) > 0.999 and fit_alpha([(4, 0.0, 1.0)]) < 1e-6
    assert fit_alpha([]) == 0.0
    xs = [float(i) for i in range(1, 9)]
    assert identified([xs, [2 * x for x in xs], [x * x for x in xs]]) == [True, False, True]
    assert nnls([xs, [x * x for x in xs]], [3 * x - 0.1 * x * x for x in xs])[1] == 0.0
    assert nnls([xs, [x * x for x in xs]], [3 * x + 0.5 * x * x for x in xs]) == pytest.approx([3.0, 0.5])


def test_a_model_carried_to_another_context_length_scales_its_times_and_keeps_acceptance():
    """search.enginepredictor: an envelope's longer length, raced without a trial, is predicted by
    the first length's model with T_target as the cost pass measured it there, k grown by what the
    raw prompt-processing slope grew (scaled as the anchored slope without raw curves), c as
    T_target; acceptance stays. Its own first trial replaces the carried model."""
    from specdec_tune.domain import Costs
    from specdec_tune.search.enginepredictor import EnginePredictor

    short = EnginePredictor()
    for g in (4, 8, 12):
        config = Config(LOOKUP, g)
        short.model.add(fabricate(config, 0.3, 0.75, 0.9, 0.4, vary=False))
    at_256 = Costs(10.0, 0.01, [10.0 + 0.5 * g for g in range(8)], 0.01, 256)
    at_2048 = Costs(20.0, 0.01, [20.0 + 1.5 * g for g in range(8)], 0.01, 2048)  # slope 3x
    long = EnginePredictor()
    assert long.predict(Config(LOOKUP, 8)) is None  # nothing measured, nothing carried
    long.carry_from(short, at_256, at_2048)
    for g in (4, 8, 16):  # T_target 20 ms as measured there (not 11 x 20 / 10), k 3x, c x 20 / 11
        ms, *_ = truth(g, 0.3, 0.75, 0.9 * 3, 0.4 * 20 / T_PLAIN, t_plain=20.0)
        assert long.predict(Config(LOOKUP, g)) == pytest.approx(20.0 / ms, rel=1e-6)
        assert long.predict(Config(LOOKUP, g)) != pytest.approx(short.predict(Config(LOOKUP, g)), rel=1e-3)
    # with the raw prompt-processing curves, k grows by their slopes' difference: 0.9 + (4 - 1) ms
    at_256.verify_raw_ms = [15.0 + 1.0 * g for g in range(8)]
    at_2048.verify_raw_ms = [30.0 + 4.0 * g for g in range(8)]
    raw = EnginePredictor()
    raw.carry_from(short, at_256, at_2048)
    ms, *_ = truth(8, 0.3, 0.75, 0.9 + 3.0, 0.4 * 20 / T_PLAIN, t_plain=20.0)
    assert raw.predict(Config(LOOKUP, 8)) == pytest.approx(20.0 / ms, rel=1e-6)
    assert "fitted at L=256" in long.explain(Config(LOOKUP, 8))
    assert [c.gamma for c, _ in long.rank([Config(LOOKUP, g) for g in (4, 8)])]
    # a raced length measures its baseline as a trial: plain timings alone keep the carried model
    long.model.add(
        Observation(
            Config(DraftSpec("none", "none"), 0), [], fabricate(Config(LOOKUP, 8), 0.3, 0.75, 0.9).plain
        )
    )
    assert "fitted at L=256" in long.explain(Config(LOOKUP, 8))
    long.model.add(fabricate(Config(LOOKUP, 8), 0.6, 0.9, 1.0, vary=False))
    assert "fitted at" not in long.explain(Config(LOOKUP, 8))  # its own trial now
    assert short.predict(Config(LOOKUP, 8)) == pytest.approx(
        speedup(8, 0.3, 0.75, 0.9, 0.4, vary=False), rel=2e-3
    )


def test_a_later_batch_size_is_predicted_from_the_b1_model_and_its_own_plain_pass():
    """search.enginepredictor.BatchedPredictor: at B > 1 a row-forward costs the plain wall ms per
    token measured there (its baseline trial), each drafted token k as at B = 1; coverage and
    acceptance are the B = 1 fit's. It learns from plain measurements only, and says nothing before
    one."""
    from types import SimpleNamespace

    from specdec_tune.search.enginepredictor import BatchedPredictor, EnginePredictor

    single = EnginePredictor()
    for g in (4, 8, 12):
        single.model.add(fabricate(Config(LOOKUP, g), 0.3, 0.75, 0.9, 0.4, vary=False))
    b4 = BatchedPredictor(single, 4)
    assert b4.predict(Config(LOOKUP, 8)) is None and "no prediction at B=4" in b4.explain(Config(LOOKUP, 8))

    def measured(tokens_per_s):
        return SimpleNamespace(metrics=SimpleNamespace(tokens_per_s=tokens_per_s))

    b4.observe(Config(LOOKUP, 8), measured(500.0))  # speculative at B: not fed
    assert b4.predict(Config(LOOKUP, 8)) is None
    b4.observe(Config(DraftSpec("none", "none"), 0), measured(125.0))  # plain at B = 4: 8 ms a token
    for g in (4, 8, 16):
        ms, *_ = truth(g, 0.3, 0.75, 0.9, 0.4, t_plain=8.0)
        assert b4.predict(Config(LOOKUP, g)) == pytest.approx(8.0 / ms, rel=1e-6)
        # cheaper row-forwards, the same verification: less to gain than at B = 1
        assert b4.predict(Config(LOOKUP, g)) < single.predict(Config(LOOKUP, g))
    ranked = [s for _, s in b4.rank([Config(LOOKUP, g) for g in (4, 16, 8)])]
    assert len(ranked) == 3 and ranked == sorted(ranked, reverse=True)
    assert (
        "at B=4" in b4.explain(Config(LOOKUP, 8)) and b4.predict(Config(DraftSpec("none", "none"), 0)) == 1.0
    )
    assert single.model.observations and all(o.config.draft.kind != "none" for o in single.model.observations)


def test_a_later_batch_size_verifies_a_drafted_token_at_the_cost_the_engine_measured_there():
    """BatchedPredictor with the engine's C_ver(B, γ) (vLLM's `Costs.batch`, raw, and the raw B = 1
    curve): k at B is the B = 1 fit's k plus (slope at B / B - slope at B = 1). A slope of B times
    B = 1's (a compute-bound forward, linear in its tokens) predicts as before; twice that adds B =
    1's slope to k, and the prediction falls to what the model's equations give with that k. A flat
    B = 1 curve (k fitted 0 there) still lets B's slope count. No curve at B: k as at 1."""
    from types import SimpleNamespace

    from specdec_tune.domain import BatchCosts, Costs
    from specdec_tune.search.enginepredictor import BatchedPredictor, EnginePredictor, verify_extra_ms

    single = EnginePredictor()
    for g in (4, 8, 12):
        single.model.add(fabricate(Config(LOOKUP, g), 0.3, 0.75, 0.9, 0.4, vary=False))
    raw_1 = [10.0 + 2.0 * g for g in range(1, 9)]  # 2 ms a drafted token at B = 1

    def costs(slope_b: float, raw: list[float] = raw_1) -> Costs:
        at_4 = BatchCosts(4, 30.0, [30.0 + slope_b * g for g in range(1, 9)])
        return Costs(11.0, 0.0, raw, 0.0, 100, batch=[at_4], verify_raw_ms=raw)

    plain = SimpleNamespace(metrics=SimpleNamespace(tokens_per_s=125.0))  # 8 ms a token at B = 4
    assert verify_extra_ms(costs(8.0), 4) == pytest.approx(0.0)
    assert verify_extra_ms(costs(16.0), 4) == pytest.approx(2.0)
    assert verify_extra_ms(costs(16.0, [30.0 - 0.5 * g for g in range(1, 9)]), 4) == pytest.approx(
        4.0
    )  # flat at 1
    assert verify_extra_ms(costs(-4.0), 4) == pytest.approx(-2.0)  # falling at B: cheaper than at 1
    assert verify_extra_ms(costs(16.0), 16) is None and verify_extra_ms(None, 4) is None  # nothing at B = 16
    assert (
        verify_extra_ms(Costs(11.0, 0.0, raw_1, 0.0, 100, batch=costs(8.0).batch), 4) is None
    )  # no raw B = 1

    linear, dearer, none = (BatchedPredictor(single, 4, c) for c in (costs(8.0), costs(16.0), None))
    for p in (linear, dearer, none):
        p.observe(Config(DraftSpec("none", "none"), 0), plain)
    for g in (4, 8, 16):
        config = Config(LOOKUP, g)
        assert linear.predict(config) == pytest.approx(none.predict(config), rel=1e-9)
        ms, *_ = truth(g, 0.3, 0.75, 0.9 + 2.0, 0.4, t_plain=8.0)
        assert dearer.predict(config) == pytest.approx(8.0 / ms, rel=1e-6)
        assert dearer.predict(config) < linear.predict(config)
    assert "+2.00 ms against B=1" in dearer.explain(Config(LOOKUP, 8))
    assert "verification as at B=1" in none.explain(Config(LOOKUP, 8))


def _with_overhead(config, q, alpha, k, c, o):
    """fabricate's observation in an engine whose speculative server pays `o` ms on every forward
    (vLLM: no async scheduling there), its plain requests at T_PLAIN."""
    spec, plain = [], []
    for i in range(6):
        n = 100.0 + 50 * i
        ms, _, drafted, accepted = truth(config.gamma, q, alpha, k, c, t_plain=T_PLAIN + o)
        spec.append(Counts(n + 1, n * ms, n * drafted, n * accepted))
        plain.append(Counts(n + 1, n * T_PLAIN))
    return Observation(config, spec, plain)


def test_an_engine_with_a_cost_per_speculative_forward_has_it_fitted_and_an_idle_draft_predicted_slower():
    """search.enginemodel's o: where the engine declares it, a draft that finds nothing to copy
    (q = 0.02) is predicted as slow as the speculative server makes every forward, not as plain."""
    rare = DraftSpec("ngram-simple:8", "prompt_lookup", ngram_min=8, ngram_max=8, lookup_match="latest")
    o_ms = 3.0
    obs = [_with_overhead(Config(LOOKUP, g), 0.3, 0.75, 0.9, 0.4, o_ms) for g in (4, 8)]
    obs += [_with_overhead(Config(rare, g), 0.02, 0.75, 0.9, 0.4, o_ms) for g in (4, 8)]
    m = EngineCostModel(obs, forward_overhead=True).fit()
    v = m.verify["ngram"]
    assert v.ms_per_forward == pytest.approx(o_ms, rel=1e-4)
    assert v.ms_per_token == pytest.approx(0.9, rel=1e-4) and v.ms_per_step == pytest.approx(0.4, rel=1e-3)
    idle = Config(rare, 6)  # never measured at γ 6
    expected = T_PLAIN / truth(6, 0.02, 0.75, 0.9, 0.4, t_plain=T_PLAIN + o_ms)[0]
    assert m.predict(idle) == pytest.approx(expected, rel=1e-3) and expected < 0.8
    assert "ms per forward of a speculative server" in m.explain(idle)
    # an engine that does not declare it (llama.cpp) fits no such term, and predicts the idle
    # draft near plain decoding
    plainer = EngineCostModel(obs).fit()
    assert plainer.verify["ngram"].ms_per_forward == 0.0
    assert plainer.predict(idle) > 0.9
    # a model carried to another context length keeps the term, scaled as T_target
    from specdec_tune.domain import Costs
    from specdec_tune.search.enginepredictor import carried_model

    carried = carried_model(m, Costs(T_PLAIN, 0.01, [], 0.01, 256), Costs(2 * T_PLAIN, 0.01, [], 0.01, 2048))
    assert carried.forward_overhead and carried.verify["ngram"].ms_per_forward == pytest.approx(2 * o_ms)
