"""app.reference: the fresh processes `run` ends with, and what is kept of them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec_tune.app.reference import process_seconds, record_reference
from specdec_tune.checkpolicy import CHECK_POLICY
from specdec_tune.measure.children import die_with_parent


def _runner(outputs):
    calls = []

    def run(cmd, **kwargs):
        calls.append((cmd, kwargs))
        out = outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        code, stdout, stderr = out
        return SimpleNamespace(returncode=code, stdout=stdout, stderr=stderr)

    return run, calls


def _line(rate, base, busy=False, spread=0.02):
    got = {"tokens_per_s": rate, "baseline_tokens_per_s": base, "baseline_spread": spread, "busy": busy}
    return (0, json.dumps(got) + "\n", "")


def test_quiet_processes_are_kept_and_the_others_say_why(tmp_path):
    run, calls = _runner(
        [
            _line(110.0, 88.0),
            _line(90.0, 70.0, busy=True),
            (2, "", "error: the profile is gone\n"),
            subprocess.TimeoutExpired("x", 1),
            _line(111.0, 87.5),
            _line(100.0, 70.0, spread=0.3),  # disturbed though the OS saw nothing
            _line(112.0, 88.5),
            _line(113.0, 89.0),  # never started: two extra processes at most
        ]
    )
    kept, note = record_reference(tmp_path / "p.yaml", processes=5, run=run)
    # The busy and the disturbed process each had another start in its place; the failed ones not.
    assert [k["baseline_tokens_per_s"] for k in kept] == [88.0, 87.5, 88.5] and len(calls) == 7
    assert "process 2 left out: other work" in note and "process 3 failed: error: the profile is gone" in note
    assert (
        "process 4 timed out" in note and "process 6 left out: its plain passes varied 30%, disturbed" in note
    )
    cmd, kwargs = calls[0]
    assert cmd[3:] == [str(tmp_path / "p.yaml"), "0", "auto"] and "specdec_tune.app.reference" in cmd[2]
    assert kwargs["timeout"] > 0  # a stuck process is killed, never left behind
    assert kwargs["preexec_fn"] is die_with_parent  # and it dies with a killed run or check


def test_the_budget_caps_the_processes(tmp_path):
    run, calls = _runner([_line(110.0, 88.0)] * 3)
    one = process_seconds(1.0)
    kept, note = record_reference(tmp_path / "p.yaml", processes=3, budget_s=one * 0.5, pass_s=1.0, run=run)
    assert kept == [] and calls == [] and "3 of 3 reference processes did not fit the budget" in note
    kept, note = record_reference(tmp_path / "p.yaml", processes=3, budget_s=1e6, pass_s=1.0, run=run)
    assert len(kept) == 3 and note == ""


def test_run_stores_the_quiet_processes_and_skips_a_busy_machine(tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    from specdec_tune.app import tuning
    from specdec_tune.domain import DecodeAnchorSpec, Noise
    from specdec_tune.store.yamlio import load_profile

    out = tmp_path / "demo.yaml"
    shutil.copy(Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml", out)
    profile = load_profile(out)
    notes = []
    progress = SimpleNamespace(note=notes.append)
    quiet = Noise(1.0, 0.01, 3, 2, 0.1, 0.0, 0.0, [], 2)
    got = [
        {"tokens_per_s": 400.0 + i, "baseline_tokens_per_s": 200.0 + i, "matmul_gflops": 210.0 + i}
        | {"speedup": 2.0 + i / 50, "plain_per_anchor": 0.7 + i / 100}
        for i in range(3)
    ]
    profile.anchors.decode_anchor = DecodeAnchorSpec([[384, 384, 24], [4096, 384, 1]])
    _one_at_a_time(monkeypatch, got)
    saved = tuning._reference(profile, out, 3, 100.0, quiet, progress)
    again = load_profile(out)
    assert (
        again.anchors.reference_baseline_tokens_per_s
        == [200.0, 201.0, 202.0]
        == (saved.anchors.reference_baseline_tokens_per_s)
    )
    assert again.anchors.reference_tokens_per_s == [400.0, 401.0, 402.0] and notes == []
    assert again.anchors.reference_matmul_gflops == 211.0
    assert again.anchors.reference_speedups == [2.0, 2.02, 2.04]  # check judges the speedup by these
    # and plain decoding per decode-anchor step by these (measure.decode_anchor)
    assert again.anchors.reference_plain_per_anchor == [0.7, 0.71, 0.72]
    assert again.anchors.decode_anchor == DecodeAnchorSpec([[384, 384, 24], [4096, 384, 1]], "float32")
    from helpers import invoke

    shown = invoke("show", out)
    assert (
        shown.exit_code == 0 and "check's reference" in shown.stdout and "200.0, 201.0, 202.0" in shown.stdout
    )
    assert "decode anchor" in shown.stdout and "0.7000, 0.7100, 0.7200" in shown.stdout
    # A busy machine: no reference at all off the check slice (a GPU's: check never judges the
    # rates of a loaded run); a CPU's processes each judge their own core (measure.narrow).
    busy = Noise(1.0, 0.01, 3, 2, 2.0, 0.0, 0.6, [], 2)
    fresh = load_profile(Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml")
    fresh.hardware["kind"] = "cuda"
    assert tuning._reference(fresh, out, 3, 100.0, busy, progress).anchors.reference_tokens_per_s == []
    assert "busy" in notes[-1]
    fresh.hardware["kind"] = "cpu"
    _one_at_a_time(monkeypatch, got)
    assert tuning._reference(fresh, out, 3, 100.0, busy, progress).anchors.reference_tokens_per_s != []
    # One quiet process is not a spread: nothing stored, and the note says so.
    fresh = load_profile(Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml")
    _one_at_a_time(monkeypatch, got[:1])
    assert tuning._reference(fresh, out, 3, 100.0, quiet, progress).anchors.reference_tokens_per_s == []
    assert "fewer than 2" in notes[-1]


def test_a_search_that_ran_over_leaves_the_reference_its_reserved_time():
    """app.tuning.reference_seconds: the README's run (240 s, three batch sizes) ran over its search
    share and ended with "3 of 3 reference processes did not fit the budget"; the reserve planned
    for them before the search is theirs whatever the search took."""
    from specdec_tune.app.tuning import reference_seconds

    assert reference_seconds(240.0, 100.0, 70.0) == 140.0  # on time: what is left
    assert reference_seconds(240.0, 247.0, 70.0) == 70.0  # ran over: the reserve still
    assert reference_seconds(None, 247.0, 70.0) is None  # no budget: no limit
    # with that reserve, record_reference starts the processes it planned (one pass 2.44 s each)
    processes = 2
    run, calls = _runner([_line(300.0, 150.0), _line(310.0, 152.0)])
    reserve = processes * process_seconds(2.44)
    budget = reference_seconds(240.0, 247.0, reserve)
    kept, note = record_reference(Path("p.yaml"), processes=processes, budget_s=budget, pass_s=2.44, run=run)
    assert len(kept) == len(calls) == processes and note == ""


def test_a_cpu_run_measures_its_reference_on_the_check_slice_every_row_included(tmp_path, monkeypatch):
    """app.tuning._reference on a CPU: the processes run on the check slice (measure.narrow), the
    profile says so (`reference_threads`), and each batch-table row keeps its own speedups there,
    which `check` judges that row by (app.checking.row_reference); a row some process missed keeps
    none rather than a partial list."""
    import shutil

    from specdec_tune.app import tuning
    from specdec_tune.app.check_rows import Judging
    from specdec_tune.app.checking import row_reference
    from specdec_tune.checkpolicy import CHECK_POLICY
    from specdec_tune.domain import Noise
    from specdec_tune.store.yamlio import load_profile

    out = tmp_path / "demo.yaml"
    shutil.copy(Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml", out)
    profile = load_profile(out)
    sizes = [r.batch_size for r in profile.batch_table if r.batch_size != 1]
    assert sizes, "the test profile needs batch-table rows beyond B = 1"
    got = [
        {"tokens_per_s": 400.0, "baseline_tokens_per_s": 200.0, "speedup": 2.0 + i / 50, "threads": 1}
        | {"core": 0, "speedups": [2.0 + i / 50, 2.2 + i / 50, 1.9 + i / 50]}
        | {
            "rows": {
                str(b): [1.4 + i / 10, 1.5 + i / 10, 1.6 + i / 10] for b in sizes[: len(sizes) - (i == 2)]
            }
        }
        for i in range(3)
    ]
    seen = _one_at_a_time(monkeypatch, got)
    quiet = Noise(1.0, 0.01, 3, 2, 0.1, 0.0, 0.0, [], 2)
    tuning._reference(profile, out, 3, 100.0, quiet, SimpleNamespace(note=print))
    assert seen["sliced"] is True
    again = load_profile(out)
    assert again.anchors.reference_threads == 1 and again.anchors.sliced
    assert again.anchors.reference_speedups == [2.0, 2.02, 2.04]  # one median per process
    # and every repeat, which check judges the speedup by on the slice (output.check.reference_side)
    assert again.anchors.reference_speedup_repeats == pytest.approx(
        [2.0, 2.2, 1.9, 2.02, 2.22, 1.92, 2.04, 2.24, 1.94]
    )
    rows = {r.batch_size: r.reference_speedups for r in again.batch_table}
    assert rows[sizes[0]] == ([1.5, 1.6, 1.7] if len(sizes) > 1 else [])
    assert rows[sizes[-1]] == []  # the third process had no speedup there
    j = Judging(0.1, None, 3, CHECK_POLICY, sliced=True)
    if len(sizes) > 1:
        row = row_reference(again, sizes[0], j)
        assert row["speedup"] == [1.5, 1.6, 1.7] and len(row["speedup_repeats"]) == 9
    assert row_reference(again, sizes[-1], j) == {}  # judged against its stored repeats
    assert row_reference(again, sizes[0], Judging(0.1, None, 3, CHECK_POLICY)) == {}  # not on the slice


def test_run_keeps_the_reference_processes_that_agree_and_says_so_where_none_do(tmp_path, monkeypatch):
    """app.tuning._reference starts its processes one at a time, as `specdec-tune reference` does:
    on the other VM three quiet processes read 1.866, 1.985 and 2.071, no two within 4 %, and
    checks against them caught a planted 15 % drop 0 times in 10 (docs/ci.md). So it starts up to
    the policy's `extra_processes` more and keeps the largest group that agrees; where none does
    within its processes, it keeps them all and says a check against them tells only a larger drop."""
    import shutil

    from specdec_tune.app import tuning
    from specdec_tune.domain import Noise
    from specdec_tune.store.yamlio import load_profile

    out = tmp_path / "demo.yaml"
    shutil.copy(Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml", out)
    quiet = Noise(1.0, 0.01, 3, 2, 0.1, 0.0, 0.0, [], 2)

    def one(speedup):
        return {"tokens_per_s": 200.0 * speedup, "baseline_tokens_per_s": 100.0, "speedup": speedup}

    notes: list[str] = []
    asked = _one_at_a_time(monkeypatch, [one(x) for x in (1.866, 1.985, 2.071, 1.972, 1.983, 1.5)])
    tuning._reference(load_profile(out), out, 3, 100.0, quiet, SimpleNamespace(note=notes.append))
    assert asked["calls"] == 5 and asked["processes"] == 1  # one at a time; the sixth never started
    assert load_profile(out).anchors.reference_speedups == [1.985, 1.972, 1.983]
    assert "2 quiet processes left out" in notes[-1] and "1.866, 1.985, 2.071, 1.972, 1.983" in notes[-1]
    # none agree within the 3 + 2 it may start: all kept, and the note says what that means
    notes.clear()
    asked = _one_at_a_time(monkeypatch, [one(x) for x in (1.7, 1.8, 1.9, 2.0, 2.1)])
    tuning._reference(load_profile(out), out, 3, 100.0, quiet, SimpleNamespace(note=notes.append))
    assert asked["calls"] == 3 + CHECK_POLICY.extra_processes
    assert load_profile(out).anchors.reference_speedups == [1.7, 1.8, 1.9, 2.0, 2.1]
    assert "do not agree within 4%" in notes[-1] and "`specdec-tune reference`" in notes[-1]
    # the time left caps the processes: none started where one does not fit
    asked = _one_at_a_time(monkeypatch, [one(2.0)] * 3)
    asked_budget = []
    tuning._reference(load_profile(out), out, 3, 0.0, quiet, SimpleNamespace(note=asked_budget.append))
    assert asked["calls"] == 0 and "did not fit the budget" in asked_budget[0]


def test_a_reference_process_on_the_slice_is_told_so_on_its_command_line(tmp_path):
    run, calls = _runner([_line(110.0, 88.0)])
    record_reference(tmp_path / "p.yaml", processes=1, run=run, sliced=True)
    assert calls[0][0][3:] == [str(tmp_path / "p.yaml"), "slice", "auto"]


def _rebase_setup(tmp_path, monkeypatch, kept, threads=1):
    """The test data's demo profile in `tmp_path`, its stored reference made on another machine (on
    the check slice where `threads`), and `record_reference` answering `kept`."""
    import shutil

    from specdec_tune.store.yamlio import load_profile, save_profile

    path = tmp_path / "demo.yaml"
    shutil.copy(Path(__file__).parents[1] / "data" / "profiles" / "cpu-amd-epyc-2t" / "demo.yaml", path)
    p = load_profile(path)
    p.anchors.reference_threads, p.anchors.machine, p.anchors.reference_speedups = threads, "elsewhere", [9.0]
    save_profile(p, path)
    return path, _one_at_a_time(monkeypatch, kept)


def _one_at_a_time(monkeypatch, kept):
    """`record_reference` answering one process a call: the next of `kept`, then none (left out as
    busy); what it was asked, and how often, in the returned dict."""
    from specdec_tune.app import reference

    asked: dict = {"calls": 0}
    queue = list(kept)

    def record(path_, processes, budget_s, pass_s, threads_, **kwargs):
        asked.update(kwargs, path=path_, processes=processes, budget_s=budget_s, threads=threads_)
        asked["calls"] += 1
        if queue:
            return [queue.pop(0)], ""
        return [], f"reference process {kwargs['first']} left out: other work was running"

    monkeypatch.setattr(reference, "record_reference", record)
    return asked


def test_reference_measures_the_profile_again_here_and_writes_it_with_this_machine(tmp_path, monkeypatch):
    """`specdec-tune reference`: the stored reference, another machine's, is replaced by one
    measured here as the stored one was (on the check slice, every batch-table row), and the
    profile says it is this machine's; with --out the original stays as it was."""
    from helpers import invoke

    from specdec_tune.measure.hardware import machine_id
    from specdec_tune.store.yamlio import load_profile

    kept = [
        {"tokens_per_s": 90.0 + i, "baseline_tokens_per_s": 80.0 + i, "speedup": 1.1 + i / 100, "threads": 1}
        | {"speedups": [1.1, 1.2], "rows": {"4": [1.3, 1.4], "16": [0.9, 1.0]}}
        for i in range(3)
    ]
    path, asked = _rebase_setup(tmp_path, monkeypatch, kept)
    out = tmp_path / "demo.here.yaml"
    r = invoke("reference", path, "--out", out, "--processes", "4")
    assert r.exit_code == 0, r.output
    assert asked["path"] == path and asked["processes"] == 1 and asked["sliced"] is True
    assert asked["rows"] == 3  # B = 1 and the two other rows of the batch table
    # 4 asked for, 3 came back: it kept starting processes up to the policy's cap
    assert asked["calls"] == CHECK_POLICY.reference_max_processes
    said = " ".join(r.output.split())
    assert "speedup 1.100, 1.110, 1.120" in said and "process 8 left out: other work" in said
    here = load_profile(out)
    assert here.anchors.machine == machine_id() and here.anchors.reference_speedups == [1.1, 1.11, 1.12]
    assert here.anchors.reference_baseline_tokens_per_s == [80.0, 81.0, 82.0]
    assert here.anchors.reference_speedup_repeats == [1.1, 1.2] * 3
    rows = {row.batch_size: row.reference_speedups for row in here.batch_table}
    assert rows == {1: [], 4: [1.35] * 3, 16: [0.95] * 3}  # each row's per-process medians
    before = load_profile(path)
    assert before.anchors.machine == "elsewhere" and before.anchors.reference_speedups == [9.0]


def test_reference_without_enough_quiet_processes_is_inconclusive_and_writes_nothing(tmp_path, monkeypatch):
    from helpers import invoke

    from specdec_tune.store.yamlio import load_profile

    one = {"tokens_per_s": 90.0, "baseline_tokens_per_s": 80.0, "speedup": 1.1}
    path, asked = _rebase_setup(tmp_path, monkeypatch, [one], threads=None)
    r = invoke("reference", path)
    assert r.exit_code == 6 and "no 2 of 8 reference processes agreed within 4%" in " ".join(r.output.split())
    assert asked["sliced"] is False and asked["rows"] == 1  # measured as the stored one was
    assert load_profile(path).anchors.reference_speedups == [9.0]


def test_reference_of_a_profile_without_anchors_is_one_red_line(tmp_path, monkeypatch):
    from helpers import invoke, one_red_line

    from specdec_tune.store.yamlio import load_profile, save_profile

    path, _ = _rebase_setup(tmp_path, monkeypatch, [])
    p = load_profile(path)
    p.anchors = None
    save_profile(p, path)
    r = invoke("reference", path)
    one_red_line(r)
    assert "has no machine anchors" in " ".join(r.output.split())


def test_reference_keeps_the_processes_that_agree_and_starts_more_until_enough_do(tmp_path, monkeypatch):
    """The quiet processes of the other VM read 1.866, 1.985 and 2.071: no two agree within 4 %, so
    `reference` starts more; once 3 agree (1.97, 1.985, 1.99) it stops, stores those and says
    which were left out (checks against such a reference caught a planted drop, docs/ci.md)."""
    from helpers import invoke

    from specdec_tune.store.yamlio import load_profile

    def one(speedup):
        return {"tokens_per_s": 200.0 * speedup, "baseline_tokens_per_s": 100.0, "speedup": speedup}

    path, asked = _rebase_setup(
        tmp_path, monkeypatch, [one(x) for x in (1.866, 1.985, 2.071, 1.97, 1.99, 1.5)]
    )
    r = invoke("reference", path, "--out", tmp_path / "here.yaml")
    assert r.exit_code == 0, r.output
    assert asked["calls"] == 5  # the sixth was never started
    assert load_profile(tmp_path / "here.yaml").anchors.reference_speedups == [1.985, 1.97, 1.99]
    said = " ".join(r.output.split())
    assert "2 quiet processes left out" in said and "1.866, 1.985, 2.071, 1.970, 1.990" in said


def test_agreeing_is_the_largest_group_within_the_bound():
    from specdec_tune.app.reference import agreeing

    assert agreeing([1.866, 1.985, 2.071], 0.04) == [0]  # no two agree: one alone
    assert agreeing([1.866, 1.985, 2.071, 1.97], 0.04) == [1, 3]
    assert agreeing([2.0, 1.0, 1.02, 1.03, 2.05], 0.04) == [1, 2, 3]
    assert agreeing([], 0.04) == []


def test_a_server_engines_process_is_given_time_for_its_server_starts(tmp_path):
    """A vLLM reference process starts two servers (tens of seconds each) before passes of a few:
    its timeout counts the starts (by the passes alone: 2 minutes for the demo pair, whose two
    starts take 100 s)."""
    run, calls = _runner([_line(110.0, 88.0), _line(110.0, 88.0)])
    record_reference(tmp_path / "p.yaml", processes=1, pass_s=3.3, run=run)
    record_reference(tmp_path / "p.yaml", processes=1, pass_s=3.3, run=run, startup_s=100.0)
    plain, with_starts = (kwargs["timeout"] for _, kwargs in calls)
    assert plain < 4 * 100.0 < with_starts
    assert with_starts == pytest.approx(4 * (process_seconds(3.3) + 100.0))


def test_reference_of_a_server_profile_plans_on_its_server_starts(tmp_path, monkeypatch):
    """`specdec-tune reference` on a profile whose engine runs as servers passes each process two
    of the profile's median starts (the plain server's and the best config's); our engine's none."""
    from helpers import invoke

    from specdec_tune.store.yamlio import load_profile, save_profile

    kept = [{"tokens_per_s": 90.0, "baseline_tokens_per_s": 80.0, "speedup": 1.1 + i / 100} for i in range(3)]
    path, asked = _rebase_setup(tmp_path, monkeypatch, kept, threads=None)
    assert invoke("reference", path).exit_code == 0
    assert asked["startup_s"] == 0.0
    p = load_profile(path)
    p.backend.start_s = 50.1
    save_profile(p, path)
    asked = _one_at_a_time(monkeypatch, kept)
    r = invoke("reference", path)
    assert r.exit_code == 0, r.output
    assert asked["startup_s"] == pytest.approx(100.2)
