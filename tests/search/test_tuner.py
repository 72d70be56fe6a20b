"""The search: end to end, resume, failing trials, shared storage between processes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import optuna
import pytest
import yaml
from helpers import a_verdict, invoke, one_red_line, tiny_args

from specdec_tune.app.common import adapt_to_noise
from specdec_tune.backends.native_pool import DrafterPool
from specdec_tune.domain import NO_DRAFT, Config, DraftSpec, Metrics, Noise, Result
from specdec_tune.errors import SpecDecError
from specdec_tune.measure.backends import NativeBackend
from specdec_tune.measurement import Measurement
from specdec_tune.runtime.workloads import Case
from specdec_tune.search import tuner
from specdec_tune.search.final import pick_finalists
from specdec_tune.search.space import TuneSettings, seed_configs
from specdec_tune.search.study import counted
from specdec_tune.search.tuner import tune
from specdec_tune.store.yamlio import load_profile, profile_to_dict


def small_case(prompts):
    return Case([p for p in prompts[1:4]], [8, 8, 8], [], 0.0)


def specs():
    return [
        DraftSpec("draft", "model", path="x"),
        DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3),
    ]


def pool(target, draft):
    return DrafterPool(specs(), target, load=lambda spec: draft)


def native(target, draft):
    """Our engine over the tiny pair: what the caller of `tune` passes (the search builds none)."""
    return NativeBackend(pool(target, draft))


@pytest.mark.slow  # a whole tune end to end: the fast tier keeps the failing-trial run
def test_tune_finds_a_config_and_records_everything(tiny_target, tiny_draft, prompts, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    settings = TuneSettings(trials=6, storage=storage, study_name="t", repeats=1, max_gamma=4)
    res = tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    finals = [r for r in res.rows if r["state"] == "FINAL"]
    assert res.trials == 6 and len(res.rows) == 6 + len(finals) and 1 <= res.finalists == len(finals) <= 3
    # The finalists (re-measured head to head) and the baseline lead, ranked by that final round;
    # the other configs follow, ranked by their search trial.
    head = res.results[: res.finalists + 1]
    # The first is the fastest of the round, tie or not; only plain decoding takes the lead from a
    # leader not resolved faster than it.
    assert head[1:] == sorted(head[1:], key=lambda r: -r.metrics.speedup)
    assert head[0].metrics.speedup == max(r.metrics.speedup for r in head) or (
        head[0].config.gamma == 0 and res.final_verdict == "tie within noise"
    )
    # A resolved round names no one tied; a tie names who tied, save plain decoding left behind by
    # a speculative leader whose paired interval lies wholly above it (racing._outcome).
    assert res.final_verdict != "resolved" or not res.final_tied
    assert res.final_verdict != "tie within noise" or bool(res.final_tied) or head[0].config.gamma > 0
    assert all((r.metrics.search_speedup is not None) == (r.config.gamma > 0) for r in head)
    rest = res.results[res.finalists + 1 :]
    assert rest == sorted(rest, key=lambda r: -r.metrics.speedup)
    assert all(r.metrics.search_speedup is None for r in rest)
    # Racing adds repeats to the first round's until the winner is resolved.
    finalists = [r for r in head if r.config.gamma]
    assert all(settings.final_repeats <= r.metrics.repeats <= settings.final_max_repeats for r in finalists)
    assert all(len(r.metrics.speedup_samples) == r.metrics.repeats for r in finalists)
    assert all(
        r.metrics.speedup_interval[0] <= r.metrics.speedup <= r.metrics.speedup_interval[1] for r in finalists
    )
    study = optuna.load_study(study_name="t", storage=storage)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert done and all(
        "acceptance_rate" in t.user_attrs and "per_position_acceptance" in t.user_attrs for t in done
    )
    # "none" (gamma 0) is always tried first: the answer may be "don't speculate".
    assert study.trials[0].params == {"draft": "none"}


@pytest.mark.slow  # two tunes in process
def test_resume_keeps_finished_trials(tiny_target, tiny_draft, prompts, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    case = small_case(prompts)
    calls = []

    def stop_after_three(done, total, best):
        calls.append(done)
        if done == 3:
            raise KeyboardInterrupt

    settings = TuneSettings(trials=5, storage=storage, study_name="r", repeats=1, max_gamma=4)
    with pytest.raises(KeyboardInterrupt):
        tune(native(tiny_target, tiny_draft), specs(), case, settings, on_trial=stop_after_three)
    study = optuna.load_study(study_name="r", storage=storage)
    first = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert len(first) == 3
    res = tune(native(tiny_target, tiny_draft), specs(), case, settings)
    study = optuna.load_study(study_name="r", storage=storage)
    assert counted(study) == 5 and res.trials == 5
    after = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert all(after[n] == p for n, p in first.items())  # nothing lost, nothing re-run


def test_failing_trial_does_not_kill_the_study(tiny_target, tiny_draft, prompts, tmp_path):
    def load(spec):
        raise RuntimeError("CUDA out of memory (simulated)")

    broken = DrafterPool(specs(), tiny_target, load=load)
    settings = TuneSettings(
        trials=8, storage=f"sqlite:///{tmp_path / 's.db'}", study_name="f", repeats=1, max_gamma=3
    )
    res = tune(NativeBackend(broken), specs(), small_case(prompts), settings)
    assert res.failed >= 1 and res.trials == 8
    errors = [r["error"] for r in res.rows if r["error"]]
    assert errors and all("out of memory" in e for e in errors)
    assert all(r.config.draft.name != "draft" for r in res.results)


@pytest.mark.slow
def test_run_end_to_end_writes_profile_and_csv(tiny_dirs, tmp_path):
    out = tmp_path / "profiles" / "tiny.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs,
            "--draft",
            tiny_dirs["draft"],
            "--draft",
            "prompt-lookup",
            "--layer-skip",
            "1",
            "--trials",
            "6",
            "--max-gamma",
            "3",
            "-n",
            "8",
            "--repeats",
            "1",
            "--storage",
            f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--out",
            out,
            "--json",
        ),
    )
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    p = load_profile(out)
    assert profile_to_dict(p) == {k: v for k, v in res.items() if k not in ("profile", "trials_csv")}
    assert p.costs is not None and len(p.costs.verify_ms) == 3
    assert p.search.trials == 6 and len(p.alternatives) <= 4
    assert all(a.config.gamma > 0 for a in p.alternatives)  # the baseline has its own section
    assert p.search.finalists >= 2 and p.search.final_repeats >= 4
    assert p.noise.plain_passes == 3 and p.noise.plain_pass_s > 0 and p.noise.cpus >= 1
    during = p.noise.during_search  # what the OS said over the search and final round
    assert during.seconds > 0 and during.busy == (during.others_cpu_share > 0.25 or during.steal_share > 0.1)
    assert p.anchors.plain_tokens_per_s > 0 and p.anchors.copy_bandwidth_gbps > 0
    assert p.anchors.matmul_gflops > 0
    assert p.search.final_verdict in ("resolved", "tie within noise") and len(p.search.final_margin) == 3
    final = [a for a in p.alternatives if a.metrics.search_speedup is not None]
    # The best beats every finalist head to head (a tie keeps the fastest and names the tied).
    if p.best.config.gamma:
        assert p.best.metrics.speedup >= max([a.metrics.speedup for a in final], default=0)
    assert p.search.final_tied == res["search"]["final_tied"]
    if p.best.config.gamma:
        assert p.best.metrics.speedup_interval and p.best.metrics.speedup_samples
    csv = out.with_suffix(".trials.csv").read_text().splitlines()
    assert csv[0].startswith("number,state,draft,gamma,threshold,speedup")
    assert (
        len(csv) == 1 + 6 + p.search.finalists and sum(",FINAL," in row for row in csv) == p.search.finalists
    )
    # The stored profile is usable by the other commands.
    assert invoke("show", out).exit_code == 0
    plots = invoke("show", out, "--plot", tmp_path / "plots")
    assert plots.exit_code == 0, plots.output
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000 for p in pngs)
    e = invoke("export", out, "--to", "vllm")
    # On these tiny models speculation and plain decoding are within noise of each other; when the
    # final round finds plain decoding fastest, export says so with exit 5 by design.
    assert e.exit_code == 0 or (p.best.config.gamma == 0 and e.exit_code == 5), e.output


def test_corrupted_profile_is_exit_2(tiny_dirs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nhardware: {slug: x}\nbest: [")
    for cmd in (["show", bad], ["export", bad], ["check", bad]):
        one_red_line(invoke(*cmd))


WORKER = """
import sys
from specdec_tune.cli import app
sys.argv = ["specdec-tune", *sys.argv[1:]]
app()
"""


@pytest.mark.slow
def test_two_processes_share_one_study(tiny_dirs, tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    args = [
        *tiny_args(
            tiny_dirs,
            "--draft",
            "prompt-lookup",
            "--trials",
            "6",
            "--max-gamma",
            "3",
            "-n",
            "6",
            "--repeats",
            "1",
            "--no-profile",
            "--storage",
            storage,
            "--study-name",
            "shared",
            # `--engine auto`: both would time it at the same moment and may disagree; the first
            # one records its mode in the study and the other takes it from there.
        )
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, "run", *args, "--out", str(tmp_path / f"p{i}.yaml"), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=storage)
    # SQLite has the slot lock: no trial is surplus, none is left running, and exactly 6 exist (a
    # broken lock shows up as a 7th trial, surplus or not)
    assert not [t.number for t in study.trials if t.user_attrs.get("surplus")]
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    assert counted(study) == 6 and sorted(t.number for t in study.trials) == list(range(6))
    modes = {yaml.safe_load((tmp_path / f"p{i}.yaml").read_text())["engine_mode"] for i in range(2)}
    assert modes == {study.user_attrs["engine_mode"]}


@pytest.mark.slow
def test_grid_run_with_sampling_covers_the_whole_grid(tiny_dirs, tmp_path):
    out = tmp_path / "grid.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs,
            "--draft",
            "prompt-lookup",
            "--layer-skip",
            "1",
            "--sampler",
            "grid",
            "--max-gamma",
            "2",
            "--temperature",
            "0.7",
            "-n",
            "6",
            "--repeats",
            "1",
            "--no-profile",
            "--storage",
            f"sqlite:///{tmp_path / 'g.db'}",
            "--out",
            out,
            "--json",
        ),
    )
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    # baseline + lookup γ1..2 + layer-skip γ1..2 × 4 thresholds = 11 configs, each tried once.
    assert p.search.trials == 11 and p.search.sampler == "grid"
    assert p.workload.temperature == 0.7
    rows = [r for r in out.with_suffix(".trials.csv").read_text().splitlines()[1:] if ",FINAL," not in r]
    configs = {tuple(row.split(",")[2:5]) for row in rows}
    assert len(rows) == len(configs) == 11


# ------------------------------------------------------------------------------ the final round


def _result(draft: str, gamma: int, speedup: float, threshold: float = 0.0) -> Result:
    spec = NO_DRAFT if draft == "none" else DraftSpec(draft, "model", path="x")
    metrics = Metrics(
        tokens_per_s=100 * speedup,
        baseline_tokens_per_s=100.0,
        speedup=speedup,
        speedup_spread=0.1,
        acceptance_rate=0.5,
        mean_accepted_len=2.0,
    )
    return Result(Config(spec, gamma, threshold), metrics)


def test_pick_finalists_takes_one_per_draft_first_and_skips_hopeless_configs():
    results = [
        _result("a", 2, 1.90),
        _result("a", 3, 1.85),
        _result("b", 4, 1.70),
        _result("a", 1, 1.60),
        _result("none", 0, 1.0),
        _result("c", 1, 1.20),  # below 0.75 × 1.90: not a contender
    ]
    names = [(r.config.draft.name, r.config.gamma) for r in pick_finalists(results, 3)]
    assert names == [("a", 2), ("a", 3), ("b", 4)]  # one per draft first, then the next best overall
    assert [(r.config.draft.name, r.config.gamma) for r in pick_finalists(results, 2)] == [("a", 2), ("b", 4)]
    assert pick_finalists(results, 0) == [] and pick_finalists([_result("none", 0, 1.0)], 3) == []
    assert len(pick_finalists(results, 3, floor=0.0)) == 3


def test_seeds_bracket_the_best_drafts_predicted_gamma_then_take_each_other_drafts_best():
    class Model:  # the cost model's ranking, best first
        drafts = ("a", "b", "c", "d")

        def rank(self, max_gamma, names, batch_size=1):
            return [("a", 8, 2.1), ("a", 7, 2.0), ("b", 3, 1.6), ("a", 6, 1.5), ("c", 2, 1.4), ("d", 1, 1.1)]

    drafts = [DraftSpec(n, "model", path="x") for n in ("a", "b", "c", "d")]
    seeds = seed_configs(drafts, Model(), TuneSettings(max_gamma=8, seed_top=4))
    # a at 8 and 7 (9 is beyond max_gamma), then one per other draft until seed_top; threshold 0
    assert [(c["draft"], c.get("gamma")) for c in seeds] == [
        ("none", None),
        ("a", 8),
        ("a", 7),
        ("b", 3),
        ("c", 2),
    ]
    assert all(c["threshold"] == 0.0 for c in seeds[1:])
    assert len(seed_configs(drafts, Model(), TuneSettings(max_gamma=8, seed_top=5))) == 1 + 5  # d at 1 too


def _fake_measurement(speedup: float, repeats: int = 4) -> Measurement:
    metrics = Metrics(
        tokens_per_s=100 * speedup,
        baseline_tokens_per_s=100.0,
        speedup=speedup,
        speedup_spread=0.05,
        acceptance_rate=0.5,
        mean_accepted_len=2.0,
        per_position_acceptance=[0.6, 0.4],
        repeats=repeats,
    )
    # Per-repeat ratios around the speedup, alternating ±1 %: resolvable when configs differ by more.
    ratios = [speedup * (1.01 if r % 2 else 0.99) for r in range(repeats)]
    return Measurement(metrics, tokens=10, mismatches=0, speedups=ratios)


class FakeBackend:
    """Answers the final round with fixed speedups per config gamma; records every call."""

    name = "fake"
    screens = False

    def __init__(self, speedup_of):
        self.speedup_of, self.calls = speedup_of, []

    def info(self):
        return {"name": self.name}

    def measure(self, configs, case, batch_size=1, repeats=3, seed=0, on_repeat=None):
        self.calls.append(([c.key for c in configs], repeats, seed))
        return [_fake_measurement(self.speedup_of(c), repeats) for c in configs]


@pytest.mark.slow  # two whole tunes end to end
def test_final_round_overrides_a_lucky_search_winner_and_is_reused(
    monkeypatch, tiny_target, tiny_draft, prompts, tmp_path
):
    """The search's top config won on one lucky trial; the head-to-head round puts it second."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    # The grid's first trials are fixed configs, and no floor: the finalists do not depend on timing.
    settings = TuneSettings(
        trials=6,
        storage=storage,
        study_name="fr",
        repeats=1,
        max_gamma=3,
        finalists=2,
        final_repeats=4,  # 4 cannot resolve a race (MeasurePolicy.min_pairs): one racing round follows
        sampler="grid",
        final_floor=0.0,
    )
    monkeypatch.setattr(tuner, "final_round", lambda *a, **k: None)
    searched = tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    monkeypatch.undo()
    expect = pick_finalists(searched.results, 2)
    assert len(expect) == 2
    # the search's winner is slower head to head
    fake = FakeBackend(lambda c: 1.1 if c.key == expect[0].config.key else 1.4)
    started = []
    res = tune(fake, specs(), small_case(prompts), settings, on_final=started.append)
    assert started == [[r.config.label for r in expect]]
    assert fake.calls[0][0] == [r.config.key for r in expect] and fake.calls[0][1] == settings.final_repeats
    assert res.results[0].config == expect[1].config and res.results[0].metrics.speedup == pytest.approx(1.4)
    assert res.results[0].metrics.search_speedup == expect[1].metrics.speedup
    assert res.results[1].config == expect[0].config and res.results[1].metrics.speedup == pytest.approx(1.1)
    assert res.results[2].config.gamma == 0  # the baseline (1.0×) closes the final round's ranking
    # 4 repeats cannot resolve (fewer than MeasurePolicy.min_pairs): one more racing round of the two did.
    assert len(fake.calls) == 2 and res.final_verdict == "resolved" and res.final_repeats == 6
    assert res.final_margin[0] == pytest.approx(1.4 / 1.1, rel=1e-3) and res.final_margin[1] > 1
    lo, hi = res.results[0].metrics.speedup_interval
    assert lo < 1.4 < hi and len(res.results[0].metrics.speedup_samples) == 6

    # Rerunning the finished study reuses the stored round instead of measuring again.
    fail = FakeBackend(lambda c: 1 / 0)
    again = tune(fail, specs(), small_case(prompts), settings, on_final=started.append)
    assert len(started) == 1 and not fail.calls  # reused: nothing was measured
    assert [r.config for r in again.results] == [r.config for r in res.results]
    assert again.results[0].metrics == res.results[0].metrics
    # A worker whose noise raised its repeats (app.common.adapt_to_noise) shares the round too.
    noisy = Noise(plain_pass_s=1.0, plain_pass_cv=0.04, plain_passes=3, cpus=2, repeats_needed=20)
    raised, _ = adapt_to_noise(settings, noisy)
    assert (
        raised.final_repeats > settings.final_repeats and raised.final_repeats_asked == settings.final_repeats
    )
    again = tune(fail, specs(), small_case(prompts), raised, on_final=started.append)
    assert len(started) == 1 and not fail.calls


@pytest.mark.slow  # a tune in process
def test_a_failing_final_round_keeps_the_search_ranking(
    monkeypatch, tiny_target, tiny_draft, prompts, tmp_path
):
    settings = TuneSettings(
        trials=5,
        storage=f"sqlite:///{tmp_path / 's.db'}",
        study_name="x",
        repeats=1,
        max_gamma=3,
        sampler="grid",
    )
    monkeypatch.setattr(tuner, "final_round", lambda *a, **k: None)
    tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    monkeypatch.undo()

    class Boom(FakeBackend):
        def measure(self, *a, **k):
            raise RuntimeError("CUDA out of memory (simulated)")

    res = tune(Boom(None), specs(), small_case(prompts), settings)
    assert res.finalists == 0 and "out of memory" in res.final_note
    assert res.results == sorted(res.results, key=lambda r: -r.metrics.speedup)
    assert all(r.metrics.search_speedup is None for r in res.results)


def test_final_round_off_ranks_by_the_search(tiny_target, tiny_draft, prompts, tmp_path):
    settings = TuneSettings(
        trials=4,
        storage=f"sqlite:///{tmp_path / 's.db'}",
        study_name="o",
        repeats=1,
        max_gamma=3,
        finalists=0,
    )
    res = tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    assert res.finalists == 0 and res.final_note == "" and len(res.rows) == 4
    assert res.results == sorted(res.results, key=lambda r: -r.metrics.speedup)


def test_the_baseline_asked_for_again_is_reused_not_measured(
    monkeypatch, tiny_target, tiny_draft, prompts, tmp_path
):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    settings = TuneSettings(trials=2, storage=storage, study_name="b", repeats=1, max_gamma=3, finalists=0)
    tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    study = optuna.load_study(study_name="b", storage=storage)
    study.enqueue_trial({"draft": "none"})  # as if the sampler picked "none" again

    def no_timing(*a, **k):
        raise AssertionError("the baseline was measured again")

    monkeypatch.setattr(NativeBackend, "measure", no_timing)
    settings.trials = 3
    res = tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    first, again = (t for t in study.get_trials() if t.params.get("draft") == "none")
    assert again.value == 1.0 and again.user_attrs["reused_baseline"] is True
    assert again.user_attrs["baseline_tokens_per_s"] == first.user_attrs["baseline_tokens_per_s"]
    assert res.trials == 3 and sum(r.config.gamma == 0 for r in res.results) == 1


@pytest.mark.slow
def test_run_at_several_batch_sizes_writes_a_batch_table(tiny_dirs, tmp_path):
    out = tmp_path / "batch.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs,
            "--draft",
            tiny_dirs["draft"],
            "--draft",
            "prompt-lookup",
            "--batch-sizes",
            "3,1",
            "--trials",
            "4",
            "--max-gamma",
            "3",
            "-n",
            "6",
            "--repeats",
            "1",
            "--final-repeats",
            "1",
            "--storage",
            f"sqlite:///{tmp_path / 'b.db'}",
            "--out",
            out,
        ),
    )
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.schema_version == 2 and [row.batch_size for row in p.batch_table] == [1, 3]
    assert p.batch_table[0].best.config == p.best.config  # batch size 1 is the classic answer
    for row in p.batch_table:
        assert row.best.metrics.baseline_tokens_per_s > 0 and row.study_name
        assert all(r.config.gamma > 0 for r in row.per_draft)
        assert len({r.config.draft.name for r in row.per_draft}) == len(row.per_draft)
    losing = [row.batch_size for row in p.batch_table if row.best.config.gamma == 0]
    assert p.b_star == (min(losing) if losing else None)
    # The cost surface: T_target and C_ver at every batch size, T_draft per draft.
    surface = {b.batch_size: b for b in p.costs.batch}
    assert set(surface) == {1, 3}
    assert all(len(b.verify_ms) == 3 and b.t_target_ms > 0 for b in surface.values())
    assert set(surface[3].t_draft_ms) == {"draft", "prompt-lookup"}
    assert p.predicted_b_star is None or p.predicted_b_star in surface
    rows = out.with_suffix(".trials.csv").read_text().splitlines()
    assert rows[0].endswith(",batch_size") and {r.rsplit(",", 1)[1] for r in rows[1:]} == {"1", "3"}
    assert invoke("show", out).exit_code == 0


@pytest.mark.slow
def test_the_budget_sizes_the_search(tiny_dirs, tmp_path):
    out = tmp_path / "budget.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs, "--draft", "prompt-lookup", "--budget", "0.5", "--max-gamma", "2", "-n", "4",
            "--repeats", "1", "--finalists", "0", "--no-profile", "--storage", f"sqlite:///{tmp_path / 'g.db'}",
            "--out", out,
        ),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    # Half a second, most of it spent loading: the search stops early and says what it could do.
    assert p.search.budget_s == 0.5 and "one plain pass" in p.search.budget_note
    assert "fewer than the default 20" in p.search.budget_note
    assert 1 <= p.search.trials < 20


@pytest.mark.slow
def test_check_re_measures_every_batch_row(tiny_dirs, tmp_path):
    out = tmp_path / "rows.yaml"
    r = invoke(
        "run",
        *tiny_args(
            tiny_dirs, "--draft", "prompt-lookup", "--batch-sizes", "1,2", "--trials", "3", "--max-gamma", "2",
            "-n", "6", "--repeats", "1", "--finalists", "0", "--no-profile",
            "--storage", f"sqlite:///{tmp_path / 'r.db'}", "--out", out,
        ),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    c = invoke("check", out, "--json", "--tolerance", "0.9", "--repeats", "1", "--allow-other-hardware")
    a_verdict(c)
    metrics = [i["metric"] for i in json.loads(c.stdout)["items"]]
    assert "speedup" in metrics and "speedup @ B=2" in metrics and "speedup @ B=1" not in metrics
    assert metrics.count("target weights") == 1
    one = invoke("check", out, "--json", "--tolerance", "0.9", "--repeats", "1", "--batch-size", "2",
                 "--allow-other-hardware")  # fmt: skip
    metrics = [i["metric"] for i in json.loads(one.stdout)["items"]]
    assert metrics[0] == "target weights" and all(m.endswith("@ B=2") for m in metrics[1:])
    missing = invoke("check", out, "--batch-size", "8")
    assert missing.exit_code == 2 and "no batch table row for batch size 8" in missing.stderr


def test_a_batch_too_large_for_memory_fails_its_trials_alone(
    monkeypatch, tiny_target, tiny_draft, prompts, tmp_path
):
    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    monkeypatch.setattr(NativeBackend, "measure", oom)
    settings = TuneSettings(
        trials=5, storage=f"sqlite:///{tmp_path / 's.db'}", study_name="oom", repeats=1, max_gamma=2,
        batch_size=64, finalists=0,
    )  # fmt: skip
    with pytest.raises(SpecDecError, match="at batch size 64: RuntimeError: CUDA out of memory"):
        tune(native(tiny_target, tiny_draft), specs(), small_case(prompts), settings)
    study = optuna.load_study(study_name="oom", storage=settings.storage)
    # Every trial ran and failed alone (the study went on to its count), each naming the batch size.
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(failed) == 5 and all("at batch size 64" in t.user_attrs["error"] for t in failed)


def test_the_budget_plans_on_the_cost_models_speedup_and_the_timeout_keeps_it():
    from specdec_tune.search.budget import TrialShape, fit_budget

    shape = TrialShape(overhead_s=0.15, warmup_passes=2 / 8)  # our engine over 8 prompts
    settings = TuneSettings(repeats=2, finalists=3, final_repeats=5)
    # Plain passes everywhere: a trial (2 x 2 passes + 2 warm-up prompts) 8.65 s; the final round
    # 4 x 5 passes and 3 finalists' 0.15 s = 40.45 s, 80.9 s with racing; 119.1 s left: 13 trials.
    plain, note = fit_budget(settings, 200.0, 2.0, shape)
    assert plain.trials == 13 and plain.timeout_s == pytest.approx(119.1)
    assert plain.final_budget_s == pytest.approx(80.9)
    assert "cost model" not in note
    # The model expects 2.25x: the finalists' passes take 1 / 2.25 of a plain one, a search trial's
    # 1 / 1.5 (the square root: trials spread between plain and the best), so 20 trials fit.
    fast, note = fit_budget(settings, 200.0, 2.0, shape, 2.25)
    assert fast.final_budget_s == pytest.approx(2 * ((1 + 3 / 2.25) * 5 * 2.0 + 0.45))
    assert fast.trials == 20 and fast.timeout_s == pytest.approx(200.0 - fast.final_budget_s)
    assert "the cost model's best 2.25x" in note and "run over" not in note
    # A machine too slow for the least a search does: the note says the budget will be exceeded.
    slow, note = fit_budget(settings, 200.0, 20.0, shape)
    assert slow.trials == 6 and "about 911 s) is more than that, so expect it to run over" in note
    # A prediction below plain plans as plain; a wild one at most 4x.
    assert fit_budget(settings, 200.0, 2.0, shape, 0.7)[0] == plain
    wild = fit_budget(settings, 200.0, 2.0, shape, 50.0)[0]
    assert wild.final_budget_s == pytest.approx(2 * ((1 + 3 / 4) * 5 * 2.0 + 0.45))


def test_an_engine_whose_trial_is_a_start_plans_its_own_least_search_and_kept_finalists():
    """vLLM: a trial is a server start (90 s here), the least search is the baseline, each of two
    drafts once and the model's best (4 trials), and the finalists race on the servers their trials
    started: no start is planned for them, so the final round is not handed minutes of racing."""
    from specdec_tune.search.budget import TrialShape, after_probe, fit_budget

    settings = TuneSettings(repeats=2, finalists=3, final_repeats=5)
    restarts = TrialShape(overhead_s=90.0, warmup_passes=1.0, plans_speedup=False)
    kept = TrialShape(
        overhead_s=90.0, warmup_passes=1.0, plans_speedup=False, min_trials=4, finalist_overhead_s=0.0
    )
    old, old_note = fit_budget(settings, 240.0, 2.0, restarts)
    new, note = fit_budget(settings, 240.0, 2.0, kept)
    assert old.trials == 6 and new.trials == 4
    # a trial 2 x 2 passes + 1 warm-up + 90 s = 100 s; the final round's first pass 4 x 5 passes of
    # 2 s, and 3 starts more where the finalists restart (270 s): its racing budget follows that
    assert new.final_budget_s == pytest.approx(40.0) and old.final_budget_s == pytest.approx(310.0)
    assert "the least a search does (4 trials and the final round's first pass, about 440 s)" in note
    assert "(6 trials" in old_note
    # after the probe (baseline and two drafts, 3 trials in 300 s), the least search is one trial more
    probed = after_probe(new, 300.0, 3, least=4)
    assert probed.timeout_s == pytest.approx(100.0)
    assert after_probe(new, 300.0, 3).timeout_s == pytest.approx(300.0)  # the default least: 6


def test_a_trial_is_cut_to_the_prompts_the_least_search_affords():
    from specdec_tune.search.budget import TrialShape, fit_budget, prompts_that_fit

    shape = TrialShape(overhead_s=0.15, warmup_passes=2 / 8)
    settings = TuneSettings(repeats=2, finalists=3, final_repeats=5)
    # 8 prompts of 2 s a pass fit 200 s (test above): all of them are measured.
    assert prompts_that_fit(settings, 200.0, 2.0, shape, 8) == 8
    # 20 s a pass: the least search of 8 prompts takes about 911 s; of k prompts about 911 x k / 8
    # (plus the finalists' start-ups), so 1 prompt would fit, and 2 is the least a trial measures.
    assert prompts_that_fit(settings, 200.0, 20.0, shape, 8) == 2
    k = prompts_that_fit(settings, 500.0, 20.0, shape, 8)
    assert k == 4 and "run over" not in fit_budget(settings, 500.0, 20.0 * k / 8, shape)[1]
    assert "run over" in fit_budget(settings, 500.0, 20.0 * (k + 1) / 8, shape)[1]


def test_past_the_least_prompts_a_trial_is_cut_to_shorter_replies():
    from specdec_tune.search.budget import TrialShape, _plan, trial_size

    shape = TrialShape(overhead_s=0.15, warmup_passes=2 / 8)
    settings = TuneSettings(repeats=2, finalists=3, final_repeats=5)
    least = lambda budget, k, t: _plan(settings, budget, 20.0 * k / 8 * t / 128, shape)[2]  # noqa: E731
    # 8 prompts of 128 tokens, 20 s a pass: at 500 s four prompts fit whole, no reply is cut.
    assert trial_size(settings, 500.0, 20.0, shape, 8, 128) == (4, 128)
    # At 200 s two prompts do not fit at 128 tokens (about 228 s), they do at 64 (115 s).
    assert least(200.0, 2, 128) > 200.0 > least(200.0, 2, 64)
    assert trial_size(settings, 200.0, 20.0, shape, 8, 128) == (2, 64)
    # At 60 s the replies are halved down to 32 tokens and no further: 58 s fits.
    assert trial_size(settings, 60.0, 20.0, shape, 8, 128) == (2, 32)
    # ... and at 20 s nothing fits: 32 tokens is the least a trial measures (the note says it runs
    # over); 48 tokens are halved to 32, not below, and 32 or fewer are never cut.
    assert trial_size(settings, 20.0, 20.0, shape, 8, 128) == (2, 32)
    assert trial_size(settings, 20.0, 20.0, shape, 8, 48) == (2, 32)
    assert trial_size(settings, 20.0, 20.0, shape, 8, 24) == (2, 24)
    # Fast enough: nothing is cut; 0 tokens means replies are never cut.
    assert trial_size(settings, 200.0, 2.0, shape, 8, 128) == (8, 128)
    assert trial_size(settings, 60.0, 20.0, shape, 8, 0) == (2, 0)


def test_a_trial_whose_overhead_is_its_cost_is_not_cut():
    """A server engine whose start dominates a trial (vLLM: 40-60 s on a 2-core CPU) buys no trial
    with a shorter pass, only noise: when nothing fits and the cut saves little, the whole
    workload is measured; where the passes are the cost, the cut is made as before."""
    from specdec_tune.search.budget import TrialShape, trial_size

    settings = TuneSettings(repeats=2, finalists=3, final_repeats=5)
    server = TrialShape(overhead_s=60.0, warmup_passes=1.0, plans_speedup=False)
    assert trial_size(settings, 240.0, 1.6, server, 8, 48) == (8, 48)  # the starts run over anyway
    passes = TrialShape(overhead_s=0.15, warmup_passes=2 / 8)
    assert trial_size(settings, 20.0, 20.0, passes, 8, 128) == (2, 32)


def test_a_confirming_cell_is_planned_as_one_race_and_the_first_cell_gets_the_rest():
    from specdec_tune.search.budget import (
        Cell,
        TrialShape,
        _plan,
        cells_trial_size,
        first_cell_share,
        pass_share,
    )

    closed_loop = TrialShape(overhead_s=1.5, warmup_passes=1.0, plans_speedup=False, batch_requests=2.0)
    # A pass at B = 4 sends 8 requests at the least: 2 of 8 prompts cost a whole pass there, a
    # quarter at B = 1; halving the replies halves both.
    assert pass_share(closed_loop, 4, 2, 8) == 1.0 and pass_share(closed_loop, 1, 2, 8) == 0.25
    assert pass_share(closed_loop, 4, 2, 8, 24, 48) == 0.5 and pass_share(closed_loop, 4, 8, 3) == 1.0
    settings = TuneSettings(repeats=3, finalists=3, final_repeats=5)
    b1 = Cell(settings, 1.0, pinned=2)
    b4 = Cell(replace(settings, batch_size=4), 11.0, pinned=3, searched=False)
    # The race: one baseline trial (one plain pass, the race measures plain again, + the untimed
    # one + a start-up) and 3 configs against one plain side, 5 repeats each, besides their
    # start-ups and exactness passes.
    race = _plan(b4.settings, 1000.0, 11.0, closed_loop, pinned=3, searched=False)
    assert race[0].trials == 1 and race[0].repeats == 1
    assert race[2] == pytest.approx((1 + 1) * 11 + 1.5 + (1 + 3) * 5 * 11 + 3 * 1.5 + 3 * 11)
    # its racing rounds get up to as much again as the first pass where the budget holds them, what
    # the budget has left beyond the baseline trial when it does not, and nothing once it is spent
    assert race[0].final_budget_s == pytest.approx(2 * ((1 + 3) * 5 * 11 + 3 * 1.5 + 3 * 11))
    short = _plan(b4.settings, 100.0, 11.0, closed_loop, pinned=3, searched=False)[0]
    assert short.final_budget_s == pytest.approx(100.0 - (1 + 1) * 11 - 1.5)
    assert _plan(b4.settings, 10.0, 11.0, closed_loop, pinned=3, searched=False)[0].final_budget_s == 0.0
    # The first cell gets what the race leaves at the least (1000 - 281 s), never less than an even
    # share (the plan then runs over, and says so); two searched cells share evenly.
    assert first_cell_share([b1, b4], 1000.0, closed_loop) == pytest.approx(719.0)
    assert first_cell_share([b1, b4], 500.0, closed_loop) == 250.0
    assert first_cell_share([b1, replace(b4, searched=True)], 1000.0, closed_loop) == 500.0
    # Cut together: at 350 s the prompts are cut to 5 (B = 4 still sends 8 requests a pass); at
    # 300 s to 2, and then the replies to 64 tokens, which is what shortens B = 4's passes.
    assert cells_trial_size([b1, b4], 400.0, closed_loop, 8, 128) == (8, 128)
    assert cells_trial_size([b1, b4], 350.0, closed_loop, 8, 128) == (5, 128)
    assert cells_trial_size([b1, b4], 300.0, closed_loop, 8, 128) == (2, 64)


def test_the_llamacpp_budget_plans_on_the_measured_plain_pass_and_says_when_it_runs_over():
    from specdec_tune.backends.llamacpp import TRIAL_SHAPE
    from specdec_tune.search.budget import fit_budget

    settings = TuneSettings(repeats=2, finalists=3, final_repeats=4)
    # A trial: a server start (1.5 s) and 2 x 2 + 1 passes of 1 s = 6.5 s. The final round: 3
    # finalists and the plain side they share, 4 passes each, and 3 starts = 20.5 s, 41 s with
    # racing; 199 s left: 30 trials fit, 20 asked.
    fits, note = fit_budget(settings, 240.0, 1.0, TRIAL_SHAPE)
    assert fits.trials == 20 and fits.timeout_s == pytest.approx(199.0) and fits.final_budget_s == 41
    assert note == "B=1: 240 s of the budget left, one plain pass 1 s, so 20 trials"
    # Two engine defaults race besides: 5 finalists, their starts, and the untimed exactness pass
    # of each default (no trial measured them) = 33.5 s, 67 s with racing.
    pinned, _ = fit_budget(settings, 240.0, 1.0, TRIAL_SHAPE, pinned=2)
    assert pinned.final_budget_s == pytest.approx(2 * ((1 + 5) * 4 * 1.0 + 5 * 1.5 + 2 * 1.0))
    # 10 s passes: 6 trials (309 s) and the first final pass (164.5 s) exceed 240 s, and it says so.
    slow, note = fit_budget(settings, 240.0, 10.0, TRIAL_SHAPE)
    assert slow.trials == 6 and slow.timeout_s == pytest.approx(309.0)
    assert note.endswith(
        "the least a search does (6 trials and the final round's first pass, about 474 s) is more than "
        "that, so expect it to run over"
    )
    # Trials screened on a third of the prompts first (search.pruning) are planned at that third
    # plus half of the rest (the share planned to go past the screen): 5 passes x 2/3 x 10 s + 1.5 s.
    screened, note = fit_budget(settings, 240.0, 10.0, TRIAL_SHAPE, screen_share=1 / 3)
    assert screened.timeout_s == pytest.approx(6 * (5 * (2 / 3) * 10.0 + 1.5))
    assert "trials screened on 33% of the prompts first, so 6 trials" in note
    assert fit_budget(settings, 240.0, 1.0, TRIAL_SHAPE, screen_share=1 / 3)[0].trials == 20
    # Final repeats the noise raised (5 asked, 8 raised) give way to the budget, down to the asked 5:
    # 8 repeats of 4 passes of 10 s are more than half of 240 s.
    noisy = TuneSettings(repeats=2, finalists=3, final_repeats=8, final_repeats_asked=5)
    cut, note = fit_budget(noisy, 240.0, 10.0, TRIAL_SHAPE)
    assert cut.final_repeats == 5 and "the final round's first pass 5 repeats (the noise asked 8)" in note
    assert fit_budget(noisy, 2400.0, 10.0, TRIAL_SHAPE)[0].final_repeats == 8


def test_the_llamacpp_probe_trials_come_out_of_the_search_timeout():
    from specdec_tune.search.budget import after_probe

    settings = TuneSettings(trials=20, timeout_s=100.0, final_budget_s=60.0)
    # 4 first trials took 40 s: 60 s of the search are left, the racing keeps its 60 s.
    assert (after_probe(settings, 40.0, 4).timeout_s, after_probe(settings, 40.0, 4).final_budget_s) == (
        60,
        60,
    )
    # 72 s (18 s each): 28 s are left, but the 2 trials the minimum of 6 still needs take 36 s at
    # that pace; the 8 s beyond come out of the racing.
    slow = after_probe(settings, 72.0, 4)
    assert slow.timeout_s == pytest.approx(36.0) and slow.final_budget_s == pytest.approx(52.0)
    # The probe did the minimum and took 50 s more than the whole search had: a timeout that ends
    # the search at once (never 0, which would mean no timeout at all), and 50 s less racing.
    spent = after_probe(settings, 150.0, 6)
    assert 0 < spent.timeout_s < 0.01 and spent.final_budget_s == pytest.approx(10.0, abs=0.01)
    assert after_probe(TuneSettings(trials=20), 72.0, 4).timeout_s is None  # no budget, no timeout


@pytest.mark.slow  # the CLI end to end, three lengths
def test_run_at_several_context_lengths_writes_the_envelope(tiny_dirs, tmp_path):
    # our engine through the same envelope pipeline as every backend (tests/test_envelope.py):
    # the prompts fitted to each length with real text by the target's own tokenizer
    out = tmp_path / "envelope.yaml"
    args = ["--draft", "prompt-lookup", "--context-lengths", "24,48", "--trials", "3", "--max-gamma", "3",
            "-n", "6", "--repeats", "1", "--final-repeats", "1", "--storage", f"sqlite:///{tmp_path / 'e.db'}",
            "--out", out]  # fmt: skip
    r = invoke("run", *tiny_args(tiny_dirs, *args))
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert [(row.batch_size, row.context_length) for row in p.context_table] == [(1, 24), (1, 48)]
    assert p.workload.context_length == 24 and len(p.envelope) == 1
    for row in p.context_table:
        assert abs(row.prompt_tokens - row.context_length) <= 8 and row.t_target_ms > 0
    plan = invoke("check", out, "--dry-run")
    assert plan.exit_code == 0 and "L=48" in plan.output, plan.output
    assert a_verdict(
        invoke("check", out, "--tolerance", "0.9", "--repeats", "1", "--allow-other-hardware")
    ) in (0, 1, 6)
