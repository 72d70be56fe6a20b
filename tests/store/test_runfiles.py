"""A profile and its trials CSV are one pair: the profile records the CSV's sha256, readers leave
out a CSV of another run, concurrent writers never leave a mixed pair, and a profile of another
target is not replaced without force."""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import time

import pytest
import yaml
from helpers import invoke, make_sample_profile

from specdec_tune.errors import SpecDecError
from specdec_tune.store.runfiles import (
    check_replaceable,
    rewrite_profile,
    save_run,
    trials_beside,
    trials_path,
)
from specdec_tune.store.yamlio import load_profile, save_profile

ROWS = [
    {"number": 0, "state": "COMPLETE", "draft": "none", "gamma": 0, "threshold": 0.0, "speedup": 1.0},
    {"number": 1, "state": "COMPLETE", "draft": "lookup", "gamma": 3, "threshold": 0.0, "speedup": 1.4},
]


def _other_target(p):
    return dataclasses.replace(p, target=dataclasses.replace(p.target, content_hash="sha256:" + "e" * 16))


def test_the_profile_records_the_sha256_of_the_csv_written_with_it(tmp_path):
    out = tmp_path / "p.yaml"
    profile, csv = save_run(make_sample_profile(), out, ROWS)
    assert csv == trials_path(out) == tmp_path / "p.trials.csv"
    assert load_profile(out).trials_sha256 == hashlib.sha256(csv.read_bytes()).hexdigest()
    assert profile.trials_sha256 == load_profile(out).trials_sha256
    assert trials_beside(load_profile(out), out) == (csv, None)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.trials.csv", "p.yaml"]  # no lock among them


def test_a_csv_of_another_run_is_left_out_with_one_line(tmp_path):
    out = tmp_path / "p.yaml"
    save_run(make_sample_profile(), out, ROWS)
    trials_path(out).write_text("number,state,draft,gamma,threshold,speedup\n0,COMPLETE,x,2,0.0,9.9\n")
    csv, why = trials_beside(load_profile(out), out)
    assert csv is None and "from another run" in why and "\n" not in why


def test_show_warns_about_a_mismatched_csv_and_does_not_mix_it_in(tmp_path):
    out = tmp_path / "p.yaml"
    save_run(make_sample_profile(), out, ROWS)
    trials_path(out).write_text("number,state,draft,gamma,threshold,speedup\n0,COMPLETE,mixed-in,2,0.0,9.9\n")
    r = invoke("show", out)
    assert r.exit_code == 0 and r.exception is None, r.output
    warnings = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning:") and "another run" in warnings[0]
    assert "mixed-in" not in r.stdout
    ok = invoke("show", out, "--trials", trials_path(out))  # named explicitly: the user's choice
    assert ok.exit_code == 0 and "mixed-in" in ok.stdout and "another run" not in ok.stderr


def test_a_profile_written_before_the_hash_takes_the_csv_beside_it(tmp_path):
    out = tmp_path / "old.yaml"
    save_profile(make_sample_profile(), out)  # trials_sha256 None, as before
    doc = yaml.safe_load(out.read_text())
    del doc["trials_sha256"]  # a file from before the field existed
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    trials_path(out).write_text("number,state,draft,gamma,threshold,speedup\n0,COMPLETE,lookup,2,0.0,1.2\n")
    p = load_profile(out)
    assert p.trials_sha256 is None
    assert trials_beside(p, out) == (trials_path(out), None)
    r = invoke("show", out)
    assert r.exit_code == 0 and r.stderr.strip() == "", r.output


def test_another_targets_profile_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "p.yaml"
    save_run(make_sample_profile(), out, ROWS)
    before = out.read_bytes(), trials_path(out).read_bytes()
    other = _other_target(make_sample_profile(gamma=6))
    with pytest.raises(SpecDecError, match=r"another target .*--force") as e:
        save_run(other, out, [{**ROWS[0], "speedup": 0.5}])
    assert "\n" not in str(e.value)
    assert (out.read_bytes(), trials_path(out).read_bytes()) == before
    check_replaceable(out, make_sample_profile().target.content_hash)  # the same target: fine
    save_run(other, out, ROWS, force=True)
    assert load_profile(out).target.content_hash == other.target.content_hash


def test_a_file_that_is_no_profile_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "notes.yaml"
    out.write_text("my notes: keep\n")
    with pytest.raises(SpecDecError, match="not a readable profile"):
        check_replaceable(out, "sha256:" + "0" * 16)
    assert out.read_text() == "my notes: keep\n"
    check_replaceable(out, "sha256:" + "0" * 16, force=True)
    check_replaceable(tmp_path / "missing.yaml", "x")  # nothing there: nothing to protect


def test_rewrite_refuses_when_another_run_replaced_the_file(tmp_path):
    out = tmp_path / "p.yaml"
    save_run(make_sample_profile(), out, ROWS)
    mine = load_profile(out)
    save_run(make_sample_profile(gamma=6), out, [*ROWS, ROWS[1]])  # another run, same target
    theirs = out.read_bytes()
    mine.category_table = []
    with pytest.raises(SpecDecError, match="another run replaced"):
        rewrite_profile(mine, out)
    assert out.read_bytes() == theirs
    now = load_profile(out)
    rewrite_profile(now, out)  # unchanged underneath: written
    assert trials_beside(load_profile(out), out)[0] == trials_path(out)


def _first_run(path: str, csv_written, second_started) -> None:
    """Writes its CSV, then waits for the second run to start before it writes its profile."""
    from pathlib import Path

    from specdec_tune.store import runfiles

    real = runfiles.atomic_write_text

    def csv_then_wait(p, text):
        real(p, text)
        csv_written.set()
        second_started.wait(30)
        time.sleep(0.5)  # without the lock, the second run writes both of its files meanwhile

    runfiles.atomic_write_text = csv_then_wait  # in this child process only
    save_run(make_sample_profile(gamma=2), Path(path), ROWS)


def _second_run(path: str, csv_written, second_started) -> None:
    from pathlib import Path

    csv_written.wait(30)
    second_started.set()
    save_run(make_sample_profile(gamma=3), Path(path), ROWS * 3)


def test_a_run_that_starts_while_another_writes_waits_for_the_whole_pair(tmp_path):
    """Run 1 has written its CSV but not its profile when run 2 starts writing. Under the lock run 2
    waits and its pair is what stays; without it, run 1's late profile would sit beside run 2's CSV."""
    out = tmp_path / "p.yaml"
    ctx = multiprocessing.get_context("fork")
    csv_written, second_started = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=f, args=(str(out), csv_written, second_started)) for f in (_first_run, _second_run)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    profile = load_profile(out)
    assert trials_beside(profile, out) == (trials_path(out), None)
    assert profile.best.config.gamma == 3 and len(trials_path(out).read_text().splitlines()) == 1 + 3 * len(
        ROWS
    )
