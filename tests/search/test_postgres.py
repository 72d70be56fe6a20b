"""Distributed tuning on a real PostgreSQL: worker processes sharing one study, a worker killed
mid-trial, one final round per study, and bad storage input as one line.

`.ci/run` starts a throwaway server (`.ci/postgres.sh`) and exports SPECDEC_TEST_POSTGRES_URL;
without it these tests skip. Each test gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import optuna
import pytest
import yaml
from helpers import invoke, one_red_line, tiny_args
from procs import final_rounds, run_args, start, states

from specdec_tune.search.study import counted

URL_VAR = "SPECDEC_TEST_POSTGRES_URL"
PASSWORD = "specdec-test-pw"  # the one .ci/postgres.sh sets; it must never be printed


@pytest.fixture
def pg_url():
    base = os.environ.get(URL_VAR)
    if not base:
        pytest.skip(f"no PostgreSQL: set {URL_VAR} (.ci/run starts one)")
    psycopg = pytest.importorskip("psycopg", reason="pip install -e '.[postgres]'")
    from sqlalchemy.engine import make_url

    u = make_url(base)
    conninfo = dict(host=u.host, port=u.port or 5432, user=u.username, password=u.password, dbname=u.database)
    try:  # set but unreachable is a failure, not a skip: CI must run these tests
        admin = psycopg.connect(**conninfo, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(f"{URL_VAR} is set but the server is unreachable: {exc}")
    db = f"specdec_t_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{db}"')
    yield u.set(drivername="postgresql+psycopg", database=db).render_as_string(hide_password=False)
    admin.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
    admin.close()


@pytest.mark.slow
def test_two_workers_fill_a_study_exactly_and_run_one_final_round(pg_url, tiny_dirs, tmp_path):
    began = time.monotonic()
    procs = [
        start(run_args(tiny_dirs, pg_url), tmp_path / f"p{i}.yaml", tmp_path, together=2) for i in range(2)
    ]
    for p in procs:
        _out, err = p.communicate(timeout=400)
        assert p.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=pg_url)
    trials = study.get_trials()
    # Exactly 12 finished trials and nothing else: no surplus, no failure, nothing lost or running.
    assert states(study) == {"COMPLETE": 12} and counted(study) == 12
    assert sorted(t.number for t in trials) == list(range(12))
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both workers measured trials
    assert all("speedup" in t.user_attrs and "acceptance_rate" in t.user_attrs for t in trials)
    assert len(final_rounds(tmp_path)) == 1, final_rounds(tmp_path)  # one final round for the study
    assert "worker" in study.user_attrs["final_round"]
    best = [yaml.safe_load((tmp_path / f"p{i}.yaml").read_text())["best"] for i in range(2)]
    assert best[0] == best[1]
    print(f"\n2 workers x 12 trials on PostgreSQL: {time.monotonic() - began:.1f} s")


@pytest.mark.slow
def test_a_worker_killed_mid_trial_costs_one_trial(pg_url, tiny_dirs, tmp_path):
    began = time.monotonic()
    victim = start(
        run_args(tiny_dirs, pg_url), tmp_path / "victim.yaml", tmp_path, hang="trial:2", together=2
    )
    other = start(run_args(tiny_dirs, pg_url), tmp_path / "other.yaml", tmp_path, together=2)
    deadline = time.monotonic() + 300
    while not (tmp_path / "hanging").exists():
        assert victim.poll() is None, victim.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.time()
    victim.wait()
    _out, err = other.communicate(timeout=400)
    assert other.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=pg_url)
    assert states(study) == {"COMPLETE": 12, "FAIL": 1} and counted(study) == 12
    (lost,) = study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert "error" not in lost.user_attrs  # lost with its worker: not a failure of the config
    assert lost.user_attrs["worker"].endswith(f":{victim.pid}")
    noticed_s = lost.datetime_complete.timestamp() - killed
    # The other worker fails stale trials between its own trials: the grace period, one
    # heartbeat, one poll, and at most the longest trial it may have been running meanwhile.
    longest = max(
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    )
    assert noticed_s <= 3 + 1 + 1 + longest + 1
    assert study.user_attrs[f"lost_trial_{lost.number}"]["worker"] == lost.user_attrs["worker"]
    assert len(final_rounds(tmp_path)) == 1, final_rounds(tmp_path)
    assert yaml.safe_load((tmp_path / "other.yaml").read_text())["search"]["trials"] == 12
    print(f"\nkilled worker: trial failed {noticed_s:.1f} s after SIGKILL; {time.monotonic() - began:.1f} s")


@pytest.mark.slow
def test_bad_storage_input_is_one_line_and_never_shows_the_password(pg_url, tiny_dirs, tmp_path):
    from sqlalchemy.engine import make_url

    u = make_url(pg_url)
    wrong = u.set(password="not-the-password").render_as_string(hide_password=False)
    closed = u.set(port=1).render_as_string(hide_password=False)
    for url, needle in (
        (wrong, "password authentication failed"),
        (closed, "refused"),
        (pg_url.replace("postgresql+psycopg", "nosuchdb"), "unknown database dialect"),
    ):
        r = invoke("studies", "list", "--storage", url)
        one_red_line(r)
        assert needle in r.stderr and PASSWORD not in r.output and "not-the-password" not in r.output
    args = tiny_args(tiny_dirs, "--trials", "1", "--finalists", "0", "-n", "4", "--repeats", "1")
    args += ["--draft", "prompt-lookup", "--no-profile", "--storage", pg_url, "--study-name", "s1"]
    ok = invoke("run", *args, "--max-gamma", "2", "--out", tmp_path / "a.yaml")
    assert ok.exit_code == 0, ok.output
    other = invoke("run", *args, "--max-gamma", "3", "--out", tmp_path / "b.yaml")
    one_red_line(other)
    assert "other settings" in other.stderr and PASSWORD not in other.output
    assert yaml.safe_load((tmp_path / "a.yaml").read_text())["search"]["storage"].count("***") == 1

    listed = invoke("studies", "list", "--storage", pg_url, "--json")
    assert listed.exit_code == 0 and [s["name"] for s in yaml.safe_load(listed.stdout)] == ["s1"]
    shown = invoke("studies", "show", "s1", "--storage", pg_url, "--json")
    assert shown.exit_code == 0 and yaml.safe_load(shown.stdout)["trials"] == {"COMPLETE": 1}
    one_red_line(invoke("studies", "delete", "nope", "--yes", "--storage", pg_url))
    assert invoke("studies", "delete", "s1", "--yes", "--storage", pg_url).exit_code == 0
    assert yaml.safe_load(invoke("studies", "list", "--storage", pg_url, "--json").stdout) == []


def test_a_missing_driver_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    r = invoke("studies", "list", "--storage", "postgresql://tuner:secret@db.internal/specdec")
    one_red_line(r)
    assert "specdec-tune[postgres]" in r.stderr and "secret" not in r.output


@pytest.mark.slow
def test_run_workers_starts_local_processes_on_one_study(tiny_dirs, tmp_path):
    """`--workers 2` on SQLite (no server needed): two processes, one study, 12 trials exactly."""
    storage = f"sqlite:///{tmp_path / 'w.db'}"
    args = [a for a in run_args(tiny_dirs, storage) if a != "--json"]
    p = start([*args, "--workers", "2"], tmp_path / "w.yaml", tmp_path)
    _out, err = p.communicate(timeout=400)
    assert p.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=storage)
    assert states(study) == {"COMPLETE": 12}
    assert len(final_rounds(tmp_path)) == 1, final_rounds(
        tmp_path
    )  # children are instrumented too (procs.HOOKS)
    assert yaml.safe_load((tmp_path / "w.yaml").read_text())["search"]["trials"] == 12


@pytest.mark.slow
def test_kill_9_of_a_sqlite_run_and_a_rerun_lose_no_finished_trial(tiny_dirs, tmp_path):
    storage = f"sqlite:///{tmp_path / 'k.db'}"
    args = run_args(tiny_dirs, storage, trials=6)
    victim = start(args, tmp_path / "k.yaml", tmp_path, hang="trial:3")
    deadline = time.monotonic() + 300
    while not (tmp_path / "hanging").exists():
        assert victim.poll() is None, victim.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    study = optuna.load_study(study_name="shared", storage=storage)
    before = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert len(before) >= 2 and states(study).get("RUNNING") == 1
    rerun = start(args, tmp_path / "k.yaml", tmp_path)  # the same command again
    _out, err = rerun.communicate(timeout=400)
    assert rerun.returncode == 0, err
    study = optuna.load_study(study_name="shared", storage=storage)
    assert states(study) == {"COMPLETE": 6, "FAIL": 1} and counted(study) == 6
    after = {t.number: t.params for t in study.trials if t.state.name == "COMPLETE"}
    assert all(after[n] == p for n, p in before.items())  # nothing finished was lost or re-run
