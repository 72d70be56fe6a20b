"""The study survives losing a worker: Optuna's heartbeat fails the dead worker's trial (on any
host, no pid check) and a rerun still reaches the requested number of finished trials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from specdec_tune.search.study import counted, redact, study_name_for

WORKER = r"""
import sys, time, pathlib
from specdec_tune.runtime.models.loading import load_model
from specdec_tune.runtime.workloads import Case
from specdec_tune.domain import DraftSpec
from specdec_tune.measure import backends
from specdec_tune.backends.native_pool import DrafterPool
from specdec_tune.search import tuner
from specdec_tune.search.space import TuneSettings

target_dir, storage, marker = sys.argv[1:4]
target = load_model(target_dir).model
real_measure = backends.NativeBackend.measure
calls = []

def measure(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the second measured trial hangs until the test kills this process
        pathlib.Path(marker).write_text("in trial")
        time.sleep(120)
    return real_measure(*args, **kwargs)

backends.NativeBackend.measure = measure
spec = DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3)
settings = TuneSettings(trials=5, storage=storage, study_name="hb", repeats=1, max_gamma=3,
                        finalists=0, heartbeat_s=1, grace_s=3)
tuner.tune(backends.NativeBackend(DrafterPool([spec], target)), [spec], Case([[5, 6, 7, 5, 6]], [6]), settings)
"""


@pytest.mark.slow
def test_a_killed_worker_costs_one_trial_and_the_study_completes(tiny_dirs, tmp_path):
    from specdec_tune.backends.native_pool import DrafterPool
    from specdec_tune.domain import DraftSpec
    from specdec_tune.measure.backends import NativeBackend
    from specdec_tune.runtime.models.loading import load_model
    from specdec_tune.runtime.workloads import Case
    from specdec_tune.search.space import TuneSettings
    from specdec_tune.search.tuner import tune

    storage = f"sqlite:///{tmp_path / 'hb.db'}"
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, tiny_dirs["target"], storage, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    study = optuna.load_study(study_name="hb", storage=storage)
    before = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert len(before) >= 1 and [t.state.name for t in study.trials].count("RUNNING") == 1

    target = load_model(tiny_dirs["target"]).model
    spec = DraftSpec("prompt-lookup", "prompt_lookup", ngram_min=1, ngram_max=3)
    settings = TuneSettings(
        trials=5,
        storage=storage,
        study_name="hb",
        repeats=1,
        max_gamma=3,
        finalists=0,
        heartbeat_s=1,
        grace_s=3,
    )
    res = tune(NativeBackend(DrafterPool([spec], target)), [spec], Case([[5, 6, 7, 5, 6]], [6]), settings)
    study = optuna.load_study(study_name="hb", storage=storage)
    states = [t.state.name for t in study.trials]
    assert counted(study) == 5 and res.trials == 5
    assert "RUNNING" not in states
    lost = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(lost) == 1 and "error" not in lost[0].user_attrs  # not counted as a real failure
    after = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert all(after[n] == p for n, p in before.items())  # nothing finished was lost or re-run


def test_study_names_and_redaction():
    a = study_name_for({"target_slug": "demo", "specdec_tune": "0.2.0", "x": 1})
    assert a == study_name_for({"x": 1, "specdec_tune": "0.2.0", "target_slug": "demo"})
    assert a != study_name_for(
        {"target_slug": "demo", "specdec_tune": "0.3.0", "x": 1}
    )  # an upgrade: new study
    assert a.startswith("specdec-demo-")
    assert redact("postgresql+psycopg://me:s3cret@db:5432/x") == "postgresql+psycopg://me:***@db:5432/x"
    assert redact("sqlite:///tmp/a.db") == "sqlite:///tmp/a.db"


def test_a_draft_whose_length_the_engine_fixes_is_searched_at_that_length_only():
    """ngram-cache drafts 8 tokens whatever is asked: every trial of it is the same config (γ 8),
    and the grid holds it once, not once per γ."""
    import optuna

    from specdec_tune.measure.llamacpp.args import parse_llamacpp_draft
    from specdec_tune.search.space import TuneSettings, config_of_params, grid_size, search_space, suggest

    cache, simple = parse_llamacpp_draft("ngram-cache"), parse_llamacpp_draft("ngram-simple:4")
    specs = {s.name: s for s in (cache, simple)}
    settings = TuneSettings(max_gamma=6, sampler="grid")
    assert grid_size([cache, simple], settings) == 1 + 1 + 6
    space = search_space([cache, simple], settings)
    trial = optuna.trial.FixedTrial({"draft": "ngram-cache", "gamma": 3})
    assert suggest(trial, specs, space).gamma == 8
    assert config_of_params({"draft": "ngram-cache"}, specs).gamma == 8
    assert config_of_params({"draft": "ngram-simple:4"}, specs) is None  # a γ it must have


def test_an_interrupt_outside_the_objective_fails_only_this_workers_trial(tmp_path):
    """A SIGTERM between Optuna creating a trial and the objective starting left it RUNNING (a rerun
    waited out its heartbeat). The interrupted worker fails it as interrupted: the trial numbered
    from `first_new` on when the objective had not started, else the one it started; a peer's
    running trial stays running."""
    import optuna
    from optuna.trial import TrialState

    from specdec_tune.search.study import INTERRUPTED, fail_interrupted

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    peer, ours = study.ask(), study.ask()
    fail_interrupted(study, url, None, first_new=ours.number)
    states = {t.number: (t.state, t.user_attrs.get(INTERRUPTED)) for t in study.get_trials()}
    assert states == {peer.number: (TrialState.RUNNING, None), ours.number: (TrialState.FAIL, True)}
    fail_interrupted(study, url, peer.number, first_new=99)
    assert study.get_trials()[peer.number].state == TrialState.FAIL
    fail_interrupted(study, url, None, first_new=0)  # nothing left running: nothing to do
