"""The serving envelope (`run --context-lengths`) end to end through the one pipeline, on the
scripted engine of tests/fake_backend.py, whose truth along L is known: "copy" loses as the context
grows and "guess" gains, so the best draft changes between 2048 and 6144 tokens; a length past its
8192 positions is left out in one line. Then what `show`, `export` and `check` make of the table,
and the envelope's rules on fabricated cells."""

from __future__ import annotations

import json

import fake_backend as fake
import pytest
from helpers import invoke

from specdec_tune.domain import Config, DraftSpec, Metrics, Result
from specdec_tune.search.cells import every_draft, later_candidates
from specdec_tune.search.results import TuneResult
from specdec_tune.store.build import envelope_lines
from specdec_tune.store.schema import ContextRow
from specdec_tune.store.yamlio import load_profile


def _run(tmp_path, *extra: str):
    out = tmp_path / "fake.yaml"
    args = ["run", "--backend", "fake", "--workload", "demo-code", "--prompts", "3", "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--out", str(out), "--reference-processes", "0", *extra]  # fmt: skip
    return invoke(*args), out


@pytest.mark.slow  # the CLI end to end: run, show, export, check
def test_context_lengths_give_a_cell_per_batch_size_and_length(tmp_path, fake_engine):
    r, out = _run(
        tmp_path, "--trials", "12", "--batch-sizes", "1,4", "--context-lengths", "256,2048,6144,9000"
    )
    assert r.exit_code == 0, r.output
    assert "context length 9000 is past the fake target's 8192 positions" in r.output
    p = load_profile(out)
    cells = [(row.batch_size, row.context_length) for row in p.context_table]
    assert cells == [(1, 256), (1, 2048), (1, 6144), (4, 256), (4, 2048), (4, 6144)]
    by = {(row.batch_size, row.context_length): row for row in p.context_table}
    # each cell's best is the scripted engine's best there, measured at that length
    assert by[1, 256].best.config.draft.name == "copy" and by[1, 6144].best.config.draft.name == "guess"
    for row in p.context_table:
        truth = fake.true_speedup(row.best.config, row.batch_size, row.context_length)
        assert row.best.metrics.speedup == pytest.approx(truth, abs=1e-4)  # stored to 4 places
        assert row.t_target_ms == pytest.approx(1000 / fake.PLAIN_TOKENS_PER_S)
        # the prompts were fitted to the length with real text (the scripted tokenizer: words)
        assert abs(row.prompt_tokens - row.context_length) <= max(8, 0.02 * row.context_length)
    # the profile's best is the shortest length's at B = 1, and its workload says so
    assert p.workload.context_length == 256 and p.best.config.label == by[1, 256].best.config.label
    assert [(line.batch_size, line.l_star) for line in p.envelope] == [(1, None), (4, None)]
    assert any("at L 6144" in c for c in p.envelope[0].kind_changes)
    # every longer length's cost profile was handed the first length's costs (what the context
    # does not change is not measured again: tests/measure/test_surface.py)
    assert fake.SCRIPT["carried"] == [(256, None), (2048, 256), (6144, 256)]
    # one study per (B, L): trials of one length never answer for another
    assert len({row.study_name for row in p.context_table}) == 6
    assert all(s.closed for s in fake.FakeModule.sessions)

    shown = invoke("show", str(out))
    assert shown.exit_code == 0 and "Context lengths" in shown.output and "pays at every L" in shown.output

    # no engine switches config by prompt length: the export names the lengths it was best for
    e = invoke("export", str(out), "--to", "hf")
    assert e.exit_code == 0, e.output
    text = " ".join(e.output.split())
    assert (
        "were measured best for prompts of 256-2048 tokens" in text
        and "at L 6144 tokens the best was guess" in text
    )

    # check re-measures every cell at its length; a slower engine is a regression there too
    c = invoke("check", str(out), "--repeats", "3", "--json")
    assert c.exit_code == 0, c.output
    metrics = {i["metric"] for i in json.loads(c.stdout)["items"]}
    assert {"speedup @ B=1, L=2048", "speedup @ B=1, L=6144", "speedup @ B=4, L=6144"} <= metrics
    # a third of the speed: past CheckPolicy.load_explains_down_to, a regression however busy the
    # machine (the suite runs two tests at once)
    fake.SCRIPT["slowdown"] = 3.0
    assert invoke("check", str(out), "--repeats", "3").exit_code == 1


@pytest.mark.slow  # the CLI end to end
def test_a_long_length_cut_by_the_budget_is_checked_as_it_was_measured(tmp_path, fake_engine, monkeypatch):
    """Each length plans its own trial size (search.budget.cells_trial_size): a plain pass of 20 s
    at 6144 tokens cuts that length's passes to 2 prompts of 64 tokens (it races, it does not search:
    a budgeted run searches its shortest length only, and the row says so), 256 keeps all 8 of 128;
    each cell records what it measured, and `check` re-measures each cell that way."""
    from specdec_tune.domain import Noise

    quick = fake.FakeSession.noise_and_anchors

    def slow_when_long(self):
        noise, anchors = quick(self)
        return (Noise(20.0, 0.002, 3, 2) if self.case.context_length >= 6144 else noise), anchors

    monkeypatch.setattr(fake.FakeSession, "noise_and_anchors", slow_when_long)
    r, out = _run(tmp_path, "--prompts", "8", "-n", "128", "--budget", "120", "--context-lengths", "256,6144")
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    cut = {row.context_length: (row.prompts, row.max_new_tokens) for row in p.context_table}
    assert cut == {256: (8, 128), 6144: (2, 64)}
    assert (p.workload.prompts, p.workload.max_new_tokens) == (8, 128)  # the best's length: uncut
    # Only the shortest length is searched: 6144 races 256's best of each draft (and the next best)
    # with the engine's default, and finds the draft that gains with the context there.
    by = {row.context_length: row for row in p.context_table}
    assert (by[256].confirmed_from, by[6144].confirmed_from) == (None, "L=256")
    # the cell that raced configs found at 256 still has the cost model's prediction of each, made
    # from its own length's costs before the race (search.tuner._predict_unpredicted)
    assert by[6144].per_draft and all(r.metrics.predicted_speedup for r in by[6144].per_draft)
    assert by[6144].best.config.draft.name == "guess" and by[256].best.config.draft.name == "copy"
    shown = invoke("show", str(out))
    assert "not searched: the top configs of L=256 raced" in " ".join(shown.output.split())
    fake.SCRIPT["budgets"].clear()
    c = invoke("check", str(out), "--repeats", "3", "--json")
    assert c.exit_code == 0, c.output
    assert [64, 64] in fake.SCRIPT["budgets"] and [128] * 8 in fake.SCRIPT["budgets"]


def _row(length: int, draft: str, speedup: float, b: int = 1) -> ContextRow:
    spec = (
        DraftSpec(name="none", kind="none") if draft == "none" else DraftSpec(name=draft, kind="ngram_simple")
    )
    gamma = 0 if draft == "none" else 4
    return ContextRow(length, b, Result(Config(spec, gamma), Metrics(1.0, 1.0, speedup, 0.0, 0.5, 2.0)))


def test_l_star_is_the_shortest_length_where_plain_decoding_wins():
    rows = [_row(256, "ngram-simple:4", 1.2), _row(2048, "ngram-mod", 1.1), _row(6144, "none", 1.0)]
    (line,) = envelope_lines(rows)
    assert line.l_star == 6144
    assert line.kind_changes == ["ngram-simple -> ngram-mod at L 2048", "ngram-mod -> none at L 6144"]
    (line,) = envelope_lines(rows[:2])
    assert line.l_star is None


def test_a_bad_context_length_is_one_red_line(tmp_path):
    r = invoke("run", "--context-lengths", "256,abc", "--out", str(tmp_path / "x.yaml"))
    assert r.exit_code == 2 and "--context-lengths" in r.output


def test_a_longer_length_races_each_draft_at_its_own_best_and_an_untried_one_at_the_best_gamma():
    """search.cells.every_draft: the shortest length's best of each draft (the best three by
    confirm_candidates, then every other draft at its own best there), and a draft with no finished
    trial there (all pruned) at the best config's gamma."""
    specs = {n: DraftSpec(name=n, kind="prompt_lookup") for n in "abcde"}

    def result(name: str, gamma: int, speedup: float) -> Result:
        draft = DraftSpec(name="none", kind="none") if name == "none" else specs[name]
        return Result(Config(draft, gamma), Metrics(1.0, 1.0, speedup, 0.0, 0.5, 2.0))

    ranked = [("a", 5, 2.0), ("b", 3, 1.5), ("c", 7, 1.4), ("d", 11, 1.3), ("d", 2, 1.1), ("none", 0, 1.0)]
    results = [result(*r) for r in ranked]
    tune = TuneResult(results, results[-1].metrics, "s", "sqlite://", 6, 0, 0, {})
    got = [(c.draft.name, c.gamma) for c in every_draft(tune, list(specs.values()), 16)]
    assert got == [("a", 5), ("b", 3), ("c", 7), ("d", 11), ("e", 5)]
    # A later batch size races the best of each draft first after a search, and the two fastest
    # after a race (each draft was raced head to head there)
    ranked = [("a", 5, 2.0), ("a", 3, 1.9), ("b", 3, 1.5), ("c", 7, 1.4), ("none", 0, 1.0)]
    results = [result(*r) for r in ranked]
    tune = TuneResult(results, results[-1].metrics, "s", "sqlite://", 5, 0, 0, {})
    searched = [(c.draft.name, c.gamma) for c in later_candidates(tune, first_raced=False)]
    assert searched == [("a", 5), ("b", 3), ("c", 7)]
    assert [(c.draft.name, c.gamma) for c in later_candidates(tune, first_raced=True)] == [("a", 5), ("a", 3)]
    # where the budget asks for fewer (app.session_plan._fewer_later): the two fastest, as after a race
    assert [(c.draft.name, c.gamma) for c in later_candidates(tune, False, 2)] == [("a", 5), ("a", 3)]


def test_later_batch_sizes_race_the_two_fastest_only_where_three_would_not_fit_what_is_left():
    """app.session_plan: with the trial cut as far as it goes, a run whose later batch sizes' races
    of CONFIRM_TOP configs (each a side of 5 passes there) are over the budget left races the
    CONFIRM_RACED fastest there, and says so; where three fit, three race."""
    import time
    from dataclasses import replace

    from specdec_tune.app.session_plan import SessionPlan, _fewer_later
    from specdec_tune.measure.llamacpp.cases import TextCase
    from specdec_tune.search.budget import Cell, TrialShape, least_seconds, pass_share
    from specdec_tune.search.space import TuneSettings

    shape = TrialShape(overhead_s=30.0, warmup_passes=1.0, own_baseline=False, plans_speedup=False,
                       batch_requests=2.0, min_trials=4, finalist_overhead_s=0.0)  # fmt: skip

    class Session:  # what the plan reads of a session
        trial_shape = shape

        def expected_speedup(self, costs, settings):
            return None

    notes: list[str] = []

    class Progress:
        def note(self, text):
            notes.append(text)

    settings = TuneSettings(repeats=2, finalists=3, final_repeats=5)
    case = TextCase([[1, 2], [3, 4]], [32, 32], 0.0)  # the trial as cut: 2 of 8 prompts, 32 of 48 tokens

    def plan(budget_s: float) -> SessionPlan:
        return SessionPlan(
            settings, None, [1, 4, 16], budget_s, time.monotonic(), 0.0, True, True, None, [],
            {1: 12.0, 4: 8.0, 16: 24.0}, 8, 48, case,
        )  # fmt: skip

    def least(top: int) -> float:  # the three cells at the least, each side of B = 16 a 16 s pass
        def cell(b: int, pinned: int, searched: bool) -> Cell:
            return Cell(
                replace(settings, batch_size=b), {1: 12.0, 4: 8.0, 16: 24.0}[b], None, pinned, searched
            )

        cells = [cell(1, 0, True), cell(4, top, False), cell(16, top, False)]
        return sum(
            least_seconds(c, 720.0 / 3, shape, pass_share(shape, c.settings.batch_size, 2, 8, 32, 48))
            for c in cells
        )

    assert least(2) < 720.0 < least(3)
    tight = plan(720.0)
    _fewer_later(tight, Session(), Progress())
    assert tight.later_top == 2 and [c.pinned for c in tight.cells(Session(), 2, 32)] == [0, 2, 2]
    assert notes == [
        f"budget: each later batch size races the 2 fastest configs of B=1, not 3: the least of every "
        f"batch size takes about {least(3):.0f} s with 3 ({least(2):.0f} s with 2), 720 s of the budget left"
    ]
    roomy = plan(least(3) + 50.0)
    _fewer_later(roomy, Session(), Progress())
    assert roomy.later_top == 3 and len(notes) == 1


@pytest.mark.slow  # the CLI end to end
def test_a_raced_length_is_predicted_by_the_first_lengths_engine_model_carried_to_it(
    tmp_path, fake_engine, monkeypatch
):
    """An engine whose cost model is fitted from trials (llama.cpp's) gets, at a length that runs no
    trial, the first length's fitted model carried to this length's costs (app.session_search ->
    search.enginepredictor), so the configs it races there have an out-of-sample prediction."""
    made = []

    class Recorder:
        def __init__(self) -> None:
            self.seen, self.carried = 0, None
            made.append(self)

        def observe(self, config, m) -> None:
            self.seen += 1

        def carry_from(self, other, costs_from, costs_to) -> None:
            self.carried = (other.seen, costs_from.context_len, costs_to.context_len)

        def predict(self, config):
            return 1.23 if self.carried else None

        def rank(self, configs):
            return []

        def explain(self, config) -> str:
            return ""

    monkeypatch.setattr(fake.FakeSession, "predictor", lambda self: Recorder())
    r, out = _run(tmp_path, "--budget", "120", "--context-lengths", "256,6144")
    assert r.exit_code == 0, r.output
    first, raced = made
    assert first.seen > 0 and first.carried is None
    assert raced.carried[0] == first.seen and raced.carried[1:] == (256, 6144)
    by = {row.context_length: row for row in load_profile(out).context_table}
    assert by[6144].confirmed_from == "L=256"
    assert [r.metrics.predicted_speedup for r in by[6144].per_draft] == [1.23] * len(by[6144].per_draft)


def test_a_batch_row_without_a_closed_form_model_shows_its_best_configs_engine_prediction():
    """store.build.batch_row: an engine backend has no closed-form model at B; its row's prediction
    is what the engine's model said of the best config before it was measured (none for plain)."""
    from specdec_tune.store.build import batch_row

    spec = DraftSpec(name="a", kind="prompt_lookup")
    best = Result(Config(spec, 5), Metrics(1.0, 1.0, 1.2, 0.0, 0.5, 2.0, predicted_speedup=1.15))
    plain = Result(Config(DraftSpec(name="none", kind="none"), 0), Metrics(1.0, 1.0, 1.0, 0.0, 0.0, 1.0))
    tune = TuneResult([best, plain], plain.metrics, "s", "sqlite://", 2, 0, 0, {})
    assert batch_row(4, tune).predicted_speedup == 1.15
    tune = TuneResult([plain, best], plain.metrics, "s", "sqlite://", 2, 0, 0, {})
    assert batch_row(4, tune).predicted_speedup is None
