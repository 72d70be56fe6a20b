"""measure.noise on a fake /proc: other processes' CPU, steal, the line to the user, repeats needed."""

from __future__ import annotations

import os

from specdec_tune.domain import Noise
from specdec_tune.measure import noise


def _stat(total_user: int, steal: int) -> str:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {total_user} 0 100 5000 0 0 0 {steal} 0 0\ncpu0 1 2 3\n"


def _proc_stat(pid: int, name: str, ppid: int, utime: int, stime: int = 0) -> str:
    tail = " ".join(["0"] * 9)  # pgrp .. cmajflt
    return f"{pid} ({name}) R {ppid} {tail} {utime} {stime} 0 0 20 0 1 0\n"


def _fake_proc(root, cpu_user, steal, procs):
    (root / "stat").write_text(_stat(cpu_user, steal))
    (root / "loadavg").write_text("1.87 1.20 0.90 3/200 4242\n")
    for pid, (name, ppid, ticks) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(_proc_stat(pid, name, ppid, ticks))


def test_os_window_sees_other_processes_and_steal_but_not_ours(tmp_path):
    me = os.getpid()
    _fake_proc(tmp_path, 1000, 0, {101: ("stress", 1, 50), 102: ("child-of-us", me, 10)})

    def work():
        # over the window: 1000 jiffies in all; stress took 500, our child 300, steal 100
        _fake_proc(tmp_path, 1900, 100, {101: ("stress", 1, 550), 102: ("child-of-us", me, 310)})
        return "done"

    result, info = noise.os_window(work, tmp_path, cpus=2)
    assert result == "done" and info["load_avg"] == 1.87
    assert info["steal_share"] == 0.1 and info["others_cpu_share"] == 0.5
    assert info["busiest"] == ["stress (101) 100% of a CPU"]


def test_repeats_needed_grows_with_the_square_of_the_noise():
    assert noise.repeats_needed(0.0) == 1
    # (2 x 1.96 x sqrt(2) x cv / 0.05)^2: 4.9 at 2 %, four times that at 4 %
    assert noise.repeats_needed(0.02) == 5 and noise.repeats_needed(0.04) == 20


def test_measure_noise_and_the_line_to_the_user(tmp_path):
    _fake_proc(tmp_path, 1000, 0, {})
    times = iter([1.0, 1.3, 0.8])
    n = noise.measure_noise(lambda: next(times), passes=3, proc=tmp_path)
    assert n.plain_passes == 3 and n.plain_pass_s == 1.0 and 0.2 < n.plain_pass_cv < 0.3
    assert n.repeats_needed > 16
    line = noise.noise_line(n, 16)
    assert line.startswith("noisy machine: plain passes vary") and "load 1.9" in line
    calm = Noise(plain_pass_s=1.0, plain_pass_cv=0.005, plain_passes=3, cpus=2, others_cpu_share=0.02)
    assert noise.noise_line(calm, 4) == "" and not noise.busy(calm)
    loaded = Noise(plain_pass_s=1.0, plain_pass_cv=0.005, plain_passes=3, cpus=2, others_cpu_share=0.5)
    busy_line = noise.noise_line(loaded, 4)
    assert (
        noise.busy(loaded)
        and busy_line.startswith("busy machine")
        and "other processes 50% of all CPUs" in busy_line
    )


def test_a_load_that_starts_during_the_search_shows_in_its_window(tmp_path):
    me = os.getpid()
    _fake_proc(tmp_path, 1000, 0, {101: ("stress", 1, 50), 102: ("llama-server", me, 10)})
    snapshot = noise.os_snapshot(tmp_path)
    # over the search: 1000 jiffies in all; stress took 400 (busy), our server 500 (never counted)
    _fake_proc(tmp_path, 1900, 100, {101: ("stress", 1, 450), 102: ("llama-server", me, 510)})
    w = noise.machine_window(snapshot, tmp_path)
    assert w.busy and w.others_cpu_share == 0.4 and w.steal_share == 0.1 and w.seconds >= 0
    assert w.busiest[0].startswith("stress (101)") and w.load_avg == 1.87
    line = noise.during_line(w)
    assert line.startswith("the machine turned busy during the search (other processes 40% of all CPUs")
    assert "steal 10%" in line and "busiest: stress (101)" in line
    # The same window with the load gone: quiet, and nothing to say.
    snapshot = noise.os_snapshot(tmp_path)
    _fake_proc(tmp_path, 2900, 100, {101: ("stress", 1, 460), 102: ("llama-server", me, 1500)})
    quiet = noise.machine_window(snapshot, tmp_path)
    assert not quiet.busy and quiet.others_cpu_share == 0.01 and noise.during_line(quiet) == ""


def test_the_llamacpp_load_hint_names_the_threads_that_wait_for_a_busy_core(monkeypatch):
    import pytest

    from specdec_tune.errors import SpecDecError
    from specdec_tune.measure.llamacpp import load as engine_plan
    from specdec_tune.measure.llamacpp.load import load_hint, server_failures
    from specdec_tune.measure.llamacpp.server import ServerError

    busy = {"others_cpu_share": 0.5, "steal_share": 0.0, "busiest": ["spin (7) 100% of a CPU"]}
    hint = load_hint(busy, 2, 2)  # one core of two taken: 2 threads wait at every step
    assert hint.startswith("the machine is busy (other processes 50% of all 2 CPUs, busiest: spin (7)")
    assert "pass --threads 1 (the cores left free)" in hint
    assert "--threads" not in load_hint(busy, 1, 2) and load_hint(busy, 1, 2).startswith(
        "the machine is busy"
    )
    assert load_hint({**busy, "others_cpu_share": 0.3}, 8, 8).endswith(
        "pass --threads 5 (the cores left free) or measure on a quiet machine"
    )
    assert load_hint({**busy, "others_cpu_share": 0.01}, 2, 2) == ""
    # Bursts averaging a quarter of 2 CPUs: not busy by the OS rule (over 25 %), but busy for 2
    # llama.cpp threads, which leave no core free; 1 thread leaves one, which the bursts fit in.
    bursts = {"others_cpu_share": 0.25, "steal_share": 0.0}
    assert not noise.busy_info(bursts)
    assert engine_plan.engine_busy(bursts, 2, 2) and not engine_plan.engine_busy(bursts, 1, 2)
    assert not engine_plan.engine_busy({"others_cpu_share": 0.05, "steal_share": 0.0}, 2, 2)
    assert load_hint(bursts, 2, 2).endswith(
        "pass --threads 1 (the cores left free) or measure on a quiet machine"
    )
    # Outside a trial a server that stops answering is one line (exit 2), not an internal error,
    # with the hint when the OS saw a busy machine meanwhile.
    monkeypatch.setattr(engine_plan.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(engine_plan, "os_since", lambda *a: {**busy, "others_cpu_share": 0.0})
    with pytest.raises(SpecDecError, match=r"^llama-server did not answer$"), server_failures(2):
        raise ServerError("llama-server did not answer")
    monkeypatch.setattr(engine_plan, "os_since", lambda *a: dict(busy))
    busy_line = r"^llama-server did not answer; the machine is busy .* pass --threads 1 "
    with pytest.raises(SpecDecError, match=busy_line), server_failures(2):
        raise ServerError("llama-server did not answer")


def test_processes_that_came_and_went_inside_the_window_are_counted(tmp_path):
    """A `pytest` or a `--help` that imports torch can start and end between the two snapshots: no
    per-process count sees it, but the busy time that nothing of ours used does."""
    me = os.getpid()
    grandchild = {201: ("compile-worker", 102, 0)}
    _fake_proc(tmp_path, 1000, 0, {me: ("us", 1, 100), 102: ("child-of-us", me, 10), **grandchild})
    snapshot = noise.os_snapshot(tmp_path)
    # 1000 jiffies in all, every one busy: we took 300, our child 200, its child 100; the 400 left
    # were taken by a process that is gone at the end (and was not there at the start).
    _fake_proc(
        tmp_path,
        2000,
        0,
        {me: ("us", 1, 400), 102: ("child-of-us", me, 210), 201: ("compile-worker", 102, 100)},
    )
    info = noise.os_since(snapshot, tmp_path, cpus=2)
    assert info["others_cpu_share"] == 0.4
    assert info["busiest"][0] == "short-lived processes 80% of a CPU"
    assert noise.busy_info(info)
    # The same window with nothing else running: only ours used the busy time.
    snapshot = noise.os_snapshot(tmp_path)
    _fake_proc(
        tmp_path,
        2600,
        0,
        {me: ("us", 1, 700), 102: ("child-of-us", me, 410), 201: ("compile-worker", 102, 200)},
    )
    quiet = noise.os_since(snapshot, tmp_path, cpus=2)
    assert quiet["others_cpu_share"] == 0.0 and quiet["busiest"] == []


def test_a_window_takes_the_engines_own_busy_rule(tmp_path):
    """llama.cpp with its threads on both cores: bursts of a fifth of all CPUs are not busy by the
    native 25 % rule but are by the engine's (measure.llamacpp.load.engine_busy)."""
    from specdec_tune.measure.llamacpp.load import engine_busy

    _fake_proc(tmp_path, 1000, 0, {101: ("bursts", 1, 0)})
    snapshot = noise.os_snapshot(tmp_path)
    _fake_proc(tmp_path, 2000, 0, {101: ("bursts", 1, 200)})
    assert not noise.machine_window(snapshot, tmp_path).busy
    strict = noise.machine_window(snapshot, tmp_path, rule=lambda info: engine_busy(info, 2, 2))
    assert strict.busy and strict.others_cpu_share == 0.2
    assert not noise.machine_window(snapshot, tmp_path, rule=lambda info: engine_busy(info, 1, 2)).busy
