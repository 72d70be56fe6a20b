"""A third backend is one module implementing the measuring session: the scripted in-memory engine
of tests/fake_backend.py, registered by name, runs `run`, `check` and `bench` end to end through
the CLI and the one pipeline, with no branch for it anywhere. Its truth is known (the best config is
`copy` at gamma 5, 1.8x), so the test says what each command must find."""

from __future__ import annotations

import json

import fake_backend as fake
import pytest
import yaml
from helpers import invoke

from specdec_tune.domain import Config, DraftSpec
from specdec_tune.store.yamlio import load_profile


def _run(tmp_path, *extra: str):
    out = tmp_path / "fake.yaml"
    args = ["run", "--backend", "fake", "--workload", "demo-code", "--prompts", "4", "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--out", str(out), "--reference-processes", "0", *extra]  # fmt: skip
    return invoke(*args), out


@pytest.mark.slow  # the CLI end to end: run, four checks, bench
def test_a_third_backend_runs_check_and_bench_through_the_one_pipeline(tmp_path, fake_engine):
    r, out = _run(tmp_path, "--trials", "14", "--batch-sizes", "1,4")
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    # The search found the scripted best draft near its best gamma, and the final round kept it.
    assert p.best.config.draft.name == "copy" and abs(p.best.config.gamma - fake.BEST_GAMMA) <= 2
    assert p.best.metrics.speedup == pytest.approx(fake.true_speedup(p.best.config), rel=1e-9)
    # What the engine said is in the profile: its build, the flags that ran, the batch table.
    assert p.backend.name == "fake" and p.backend.build == fake.BUILD
    assert p.best.backend_args == ["fake-server", "--draft", "copy", "--n", str(p.best.config.gamma)]
    assert [row.batch_size for row in p.batch_table] == [1, 4] and p.b_star is None
    # The engine's own default raced in the final round: kept beside the answer, which beats it.
    (default,) = p.backend.engine_defaults
    assert default["config"] == f"copy γ={fake.DEFAULT_GAMMA}" and default["flags"][-1] == str(
        fake.DEFAULT_GAMMA
    )
    assert default["speedup"] == pytest.approx(
        fake.true_speedup(Config(p.best.config.draft, fake.DEFAULT_GAMMA)), rel=1e-3
    )
    assert p.best.metrics.speedup > default["speedup"]
    assert out.with_name("fake.trials.csv").exists()
    assert all(s.closed for s in fake.FakeModule.sessions) and fake.FakeModule.sessions

    # check re-measures every row in the engine: a pass as measured, a regression when slower.
    c = invoke("check", str(out), "--repeats", "3", "--json")
    assert c.exit_code == 0, c.output
    assert {i["metric"] for i in json.loads(c.stdout)["items"]} >= {"speedup", "speedup @ B=4"}
    assert {b for _, b in fake.SCRIPT["measured"][-4:]} == {1, 4}
    # a third of the speed: past CheckPolicy.load_explains_down_to, a regression however busy the
    # machine (the suite runs two tests at once)
    fake.SCRIPT["slowdown"] = 3.0
    c = invoke("check", str(out), "--repeats", "3", "--json")
    assert c.exit_code == 1, c.output
    assert fake.SCRIPT["renewed"] == 0  # an engine that keeps its processes is confirmed in them
    # An engine whose processes differ (backends.protocols.Judged.renew) is confirmed in new ones,
    # at every row that needs it, with as many repeats as the first measurement
    fake.SCRIPT["renews"] = True
    c = invoke("check", str(out), "--repeats", "3", "--json")
    assert c.exit_code == 1 and fake.SCRIPT["renewed"] == 2, c.output
    speedups = [i for i in json.loads(c.stdout)["items"] if i["metric"].startswith("speedup")]
    assert len(speedups) == 2 and all("re-measured: 6 repeats" in i["note"] for i in speedups)
    fake.SCRIPT["slowdown"] = 1.0
    # Another engine build is other software (exit 3) before anything is measured.
    fake.SCRIPT["build"] = {"package": "fake-engine 2.0", "binary_sha256": "sha256:other"}
    before = len(fake.SCRIPT["measured"])
    c = invoke("check", str(out))
    assert c.exit_code == 3 and "other software" in c.output, c.output
    assert len(fake.SCRIPT["measured"]) == before
    assert invoke("check", str(out), "--allow-other-build").exit_code == 0

    # bench one config against plain, in the same engine.
    b = invoke(
        "bench", "--backend", "fake", "--draft", "copy", "--gamma", "5", "--workload", "demo-code", "--json"
    )
    assert b.exit_code == 0, b.output
    got = json.loads(b.stdout)
    assert got["speedup"] == pytest.approx(1.8) and got["device"] == "fake engine"


@pytest.mark.slow  # the CLI end to end
def test_a_budget_too_short_cuts_the_prompts_then_the_replies_and_check_measures_what_ran(
    tmp_path, fake_engine, monkeypatch
):
    """search.budget.trial_size through the pipeline: a plain pass of 8 prompts x 128 tokens takes
    20 s here, the least search does not fit 60 s, so every pass measures 2 prompts of 32 tokens;
    the profile's workload says so and `check` measures exactly that."""
    from specdec_tune.domain import Anchors, Noise

    quick = fake.FakeSession.noise_and_anchors
    slow = lambda self: (Noise(20.0, 0.002, 3, 2), Anchors(fake.PLAIN_TOKENS_PER_S, None, None))  # noqa: E731
    monkeypatch.setattr(fake.FakeSession, "noise_and_anchors", slow)
    out = tmp_path / "fake.yaml"
    r = invoke(
        "run", "--backend", "fake", "--workload", "demo-code", "--prompts", "8", "-n", "128", "--budget", "60",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out), "--reference-processes", "0",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "the first 2 of the 8 prompts, 32 new tokens each (not 128)" in " ".join(r.output.split())
    assert fake.SCRIPT["budgets"] and all(b == [32, 32] for b in fake.SCRIPT["budgets"])
    p = load_profile(out)
    assert (p.workload.prompts, p.workload.max_new_tokens) == (2, 32)
    assert "32 new tokens each" in p.search.budget_note
    # where the time went: every phase the session ran, and the note says so
    assert {"opening the engine", "costs", "noise and anchors", "B=1: final round", "exactness"} <= set(
        p.search.time_spent
    )
    assert "s went to: " in p.search.budget_note
    fake.SCRIPT["budgets"].clear()
    monkeypatch.setattr(fake.FakeSession, "noise_and_anchors", quick)  # check at the engine's own speed
    c = invoke("check", str(out), "--repeats", "3")
    assert c.exit_code == 0, c.output
    assert fake.SCRIPT["budgets"] and all(b == [32, 32] for b in fake.SCRIPT["budgets"])


@pytest.mark.slow  # the CLI end to end
def test_the_trial_is_cut_for_the_slowest_batch_size_before_any_search(tmp_path, fake_engine, monkeypatch):
    """A plain pass takes 0.01 s at B = 1 and 20 s at B = 4: the least search fits 120 s at B = 1
    with every prompt, not at B = 4, so every pass at both sizes measures 2 prompts of 64 tokens (at
    B = 4 a pass of 2 prompts costs as much as one of 4: search.budget.pass_share; B = 4's baseline
    trial is one plain pass, its race measures plain again),
    planned before B = 1's search (each plain pass at each size measured once). B = 4 is not
    searched: B = 1's top three race head to head against plain there, and its row says so."""
    timed: list[int] = []

    def pass_seconds(self, batch_size: int) -> float:
        timed.append(batch_size)
        return 20.0

    monkeypatch.setattr(fake.FakeSession, "pass_seconds", pass_seconds)
    out = tmp_path / "fake.yaml"
    r = invoke(
        "run", "--backend", "fake", "--workload", "demo-code", "--prompts", "8", "-n", "128", "--budget", "120",
        "--batch-sizes", "1,4", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out),
        "--reference-processes", "0",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert timed == [4]
    said = " ".join(r.output.split())
    assert "the first 2 of the 8 prompts, 64 new tokens each (not 128)" in said
    assert "at every batch size" in said
    assert fake.SCRIPT["budgets"] and all(b == [64, 64] for b in fake.SCRIPT["budgets"])
    p = load_profile(out)
    assert (p.workload.prompts, p.workload.max_new_tokens) == (2, 64)
    one, four = p.batch_table
    assert (one.confirmed_from, four.confirmed_from) == (None, "B=1")
    # B = 4's study is the baseline alone; its final round raced B = 1's best of each draft and
    # the next best config (search.cells.confirm_candidates), and nothing else
    import optuna

    study = optuna.load_study(study_name=four.study_name, storage=f"sqlite:///{tmp_path / 's.db'}")
    assert [t.params.get("draft") for t in study.trials] == ["none"]
    raced = {tuple(c) for c in study.user_attrs["final_round"]["key"]["configs"]}
    assert len(raced) == 3 and {tuple(r.config.key) for r in one.per_draft} < raced
    assert {r.config.draft.name for r in one.per_draft} == set(fake.DRAFTS)
    assert four.best.config.gamma == 0 or tuple(four.best.config.key) in raced
    shown = invoke("show", str(out))
    assert shown.exit_code == 0 and "not searched: the top configs of B=1 raced" in " ".join(
        shown.output.split()
    )


def test_an_unknown_backend_is_one_line_naming_the_known_ones(tmp_path, fake_engine):
    r, _ = _run(tmp_path, "--trials", "6")
    assert r.exit_code == 0, r.output
    bad = invoke("bench", "--backend", "sglang", "--draft", "copy")
    assert (
        bad.exit_code == 2
        and "unknown backend 'sglang': use native or llamacpp or vllm or fake" in bad.output
    )


@pytest.mark.slow  # the CLI end to end
def test_a_profile_checked_with_another_backend_is_refused(tmp_path, fake_engine):
    r, out = _run(tmp_path, "--trials", "6")
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert doc["backend"]["name"] == "fake"
    c = invoke("check", str(out), "--backend", "llamacpp")
    assert c.exit_code == 2 and "measured with the fake backend, not llamacpp" in c.output


@pytest.mark.slow  # the CLI end to end
def test_trials_are_screened_on_their_first_prompts_and_the_losing_ones_stop_there(tmp_path, fake_engine):
    """Every speculative trial reports its first prompts' speedup to the study's pruner; a config
    clearly below the best there (the scripted `guess` draft, 1.1x against `copy`'s 1.8x, or `copy`
    far from its best gamma) stops, one within the noise margin of the best never does, and the
    pruned trials are in the trials CSV."""
    r, out = _run(tmp_path, "--trials", "14")
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.best.config.draft.name == "copy"
    screened = fake.SCRIPT["screened"]
    stopped = [label for label, went_on in screened if not went_on]
    assert any(label.startswith("guess") for label in stopped), screened
    truth = {
        f"{d} γ={g}": fake.true_speedup(Config(DraftSpec(d, "prompt_lookup"), g))
        for d in fake.DRAFTS
        for g in range(1, 17)
    }
    best = max(truth.values())
    assert all(truth[label] < 0.95 * best for label in stopped), screened
    assert all(went_on for label, went_on in screened if truth[label] >= 0.95 * best), screened
    import csv

    rows = list(csv.DictReader(out.with_name("fake.trials.csv").open()))
    assert sum(row["state"] == "PRUNED" for row in rows) == len(stopped)
    # --screen-prompts 0 turns it off: no trial is screened
    fake.SCRIPT["screened"] = []
    r, _ = _run(tmp_path, "--trials", "8", "--screen-prompts", "0", "--force")
    assert r.exit_code == 0, r.output
    assert fake.SCRIPT["screened"] == []


def test_the_ledger_counts_each_phase_from_the_last_mark_and_moves_the_trials_out_of_their_cell(monkeypatch):
    """app.session_search.Ledger: seconds since the previous mark go to the phase named; a cell's
    trials (their own durations) are moved out of its final round; the note lists them all."""
    from specdec_tune.app import session_search

    clock = iter([10.0, 25.0, 27.5, 127.5])
    monkeypatch.setattr(session_search.time, "monotonic", lambda: next(clock))
    ledger = session_search.Ledger(0.0)
    ledger.mark("opening the engine")  # 10 s
    ledger.mark("costs")  # 15 s
    ledger.mark("noise and anchors")  # 2.5 s
    ledger.mark("B=1: final round")  # 100 s, 80 of them trials
    ledger.split("B=1: final round", "B=1: trials", 80.0)
    ledger.split("B=1: final round", "nothing", 0.0)  # nothing to move: no phase
    assert ledger.spent == {
        "opening the engine": 10.0, "costs": 15.0, "noise and anchors": 2.5, "B=1: final round": 20.0,
        "B=1: trials": 80.0,
    }  # fmt: skip
    ledger.split("costs", "more than it had", 99.0)  # never more than the phase took
    assert ledger.spent["costs"] == 0.0 and ledger.spent["more than it had"] == 15.0
    assert ledger.note().startswith("128 s went to: opening the engine 10 s, ")


@pytest.mark.slow  # the CLI end to end: a run, two checks
def test_on_the_check_slice_a_first_look_passes_at_once_only_with_its_interval_clear_of_the_floor(
    tmp_path, fake_engine
):
    """checkpolicy.on_slice: a check on the check slice whose first speedup clears the floor by its
    estimate while its interval reaches below it is measured again before it passes; one whose
    interval clears the floor passes at once."""
    import os

    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the check slice needs two cores to pin")
    r, out = _run(tmp_path, "--trials", "6")
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    s = doc["best"]["metrics"]["speedup"]

    def check(spread: float) -> str:
        doc["anchors"] = {
            "plain_tokens_per_s": 1.0,
            "reference_tokens_per_s": [1.0, 1.0, 1.0],
            "reference_baseline_tokens_per_s": [1.0, 1.0, 1.0],
            "reference_speedups": [s, s, s],
            "reference_threads": 1,  # measured on the slice: the check measures there too
            "reference_speedup_repeats": [s * (1 + spread * k) for k in (-2, -1, 0, 0, 1, 2)],
        }
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        c = invoke(
            "check", str(out), "--repeats", "3", "--tolerance", "0.05", "--allow-other-hardware", "--json"
        )
        assert c.exit_code == 0, c.output
        got = json.loads(c.stdout)
        assert got["noise"].get("core") in os.sched_getaffinity(0)  # it ran on the slice
        return next(i for i in got["items"] if i["metric"] == "speedup")["note"]

    assert "re-measured" not in check(0.004)  # [0.99, 1.01]-ish of stored: clear of 0.95
    assert "re-measured" in check(0.04)  # the estimate 1.0, the interval below 0.95: confirmed


@pytest.mark.slow  # the CLI end to end
def test_an_engine_that_slices_ends_its_run_with_a_reference_on_the_check_slice(
    tmp_path, fake_engine, monkeypatch
):
    """`slices` is a value of the session: a run of such an engine on a CPU hands the reference
    processes the check slice and every batch-table row to measure (app.tuning._reference), plans
    their time with those rows, and the profile says where they measured."""
    from specdec_tune.app import reference

    asked = {"calls": 0}

    def record(out, processes, left_s, pass_s, threads, **kwargs):
        asked.update(kwargs, processes=processes)
        asked["calls"] += 1
        one = {"tokens_per_s": 180.0, "baseline_tokens_per_s": 100.0, "speedup": 1.8, "threads": 1}
        return [one | {"speedups": [1.8, 1.79], "rows": {"4": [1.3, 1.31]}} for _ in range(processes)], ""

    monkeypatch.setattr(fake.FakeSession, "slices", True)
    monkeypatch.setattr(reference, "record_reference", record)
    out = tmp_path / "fake.yaml"
    r = invoke(
        "run", "--backend", "fake", "--workload", "demo-code", "--prompts", "4", "--trials", "6",
        "--batch-sizes", "1,4", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out),
        "--reference-processes", "2",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    # one process at a time (app.reference.settle), two that agree
    assert asked["sliced"] is True and asked["rows"] == 2 and asked["processes"] == 1 and asked["calls"] == 2
    p = load_profile(out)
    assert p.anchors.reference_threads == 1 and p.anchors.reference_speedup_repeats == [1.8, 1.79, 1.8, 1.79]
    assert {row.batch_size: row.reference_speedups for row in p.batch_table}[4] == [1.305, 1.305]
