"""measure.preemption: how long our threads waited for a CPU, and the repeats rebuilt from the prompts
no other process preempted; the test-only planted slowdown (measure.planted)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from specdec_tune.measure import planted, preemption, timing


def _part(seconds, waited, units):
    return (seconds, waited, units)


def test_clean_ratios_rebuild_repeats_from_unpreempted_prompt_pairs():
    # the docstring's example: 2 prompts, 3 repeats, prompt 1's pair of repeat 0 preempted
    spec = [[_part(1.0, 0.0, 10), _part(1.0, 0.5, 10)], [_part(1.0, 0.0, 10), _part(2.0, 0.0, 20)]]
    spec.append([_part(1.0, 0.0, 10), _part(1.0, 0.0, 10)])
    plain = [[_part(2.0, 0.0, 10), _part(2.0, 0.0, 10)] for _ in range(3)]
    ratios, share = preemption.clean_ratios(spec, plain, 0.03)
    assert share == pytest.approx(5 / 6)
    assert ratios == pytest.approx([2.0, 2.0])  # every rebuilt repeat covers both prompts


def test_a_pair_is_unclean_when_either_side_waited():
    spec = [[_part(1.0, 0.0, 10)]]
    plain = [[_part(2.0, 0.2, 10)]]  # the plain side waited 10 %
    assert preemption.clean_ratios(spec, plain, 0.03) == ([], 0.0)
    assert preemption.clean_ratios(spec, plain, 0.2)[0] == pytest.approx([2.0])


def test_a_uniform_slowdown_of_both_sides_cancels_and_one_sides_does_not():
    plain = [[_part(2.0, 0.0, 10)] * 4]
    spec = [[_part(1.0, 0.0, 10)] * 4]
    both = [[_part(2.8, 0.0, 10)] * 4], [[_part(1.4, 0.0, 10)] * 4]
    one = [[_part(1.15, 0.0, 10)] * 4]
    assert preemption.clean_ratios(spec, plain, 0.03)[0] == pytest.approx([2.0])
    assert preemption.clean_ratios(both[1], both[0], 0.03)[0] == pytest.approx([2.0])
    assert preemption.clean_ratios(one, plain, 0.03)[0] == pytest.approx([2.0 / 1.15])


def test_waited_share_and_waited_since_take_the_longest_waiting_thread():
    assert preemption.waited_share([[_part(2.0, 0.5, 1)]], [[_part(2.0, 0.0, 1)]]) == pytest.approx(0.125)
    assert preemption.waited_since({1: 1.0, 2: 5.0}, {1: 1.5, 2: 5.2, 3: 9.0}) == pytest.approx(0.5)
    assert preemption.waited_since(None, {1: 1.0}) == 0.0


def test_thread_waits_read_this_processes_threads(tmp_path):
    task = tmp_path / str(os.getpid()) / "task"
    for tid, waited_ns in ((11, 2_000_000_000), (12, 500_000_000)):
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "schedstat").write_text(f"123 {waited_ns} 7\n")
    assert preemption.thread_waits(tmp_path) == {11: 2.0, 12: 0.5}
    assert preemption.thread_waits(tmp_path / "none") is None


def test_interleaved_parts_logs_each_parts_seconds_and_wait():
    log: dict = {}
    out = timing.interleaved_parts(
        {"a": lambda r, p: p, "b": lambda r, p: p}, 2, 3, "cpu", log=log
    )  # fmt: skip
    assert set(log) == {"a", "b"} and len(log["a"]) == 2 and len(log["a"][0]) == 3
    for key in log:
        for r, rep in enumerate(log[key]):
            assert sum(s for s, _ in rep) == pytest.approx(out[key][r][0])
            assert all(0.0 <= w <= s for s, w in rep)


@pytest.mark.skipif(preemption.thread_waits() is None, reason="no schedstat on this kernel")
def test_a_thread_that_sleeps_never_counts_as_waiting():
    before = preemption.thread_waits()
    threading.Thread(target=time.sleep, args=(0.2,)).start()
    time.sleep(0.25)
    assert preemption.waited_since(before, preemption.thread_waits()) < 0.2


def test_the_planted_slowdown_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(planted.SLOWER_SPEC_ENV, raising=False)
    assert planted.slower_spec_factor() == 1.0
    monkeypatch.setenv(planted.SLOWER_SPEC_ENV, "1.15")
    assert planted.slower_spec_factor() == pytest.approx(1.15)
    p = planted.planted_pass({"ms": 100.0, "tok_s": 50.0, "tokens": 5})
    assert p["ms"] == pytest.approx(115.0) and p["tok_s"] == pytest.approx(50.0 / 1.15)
    monkeypatch.setenv(planted.SLOWER_SPEC_ENV, "fast")
    assert planted.slower_spec_factor() == 1.0
