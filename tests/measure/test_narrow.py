"""measure.narrow: the check slice, and the OS's view of a process pinned there (measure.noise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec_tune.checkpolicy import CHECK_POLICY, LLAMACPP_CHECK_POLICY
from specdec_tune.measure import narrow, noise


def _stat(tmp_path, cpus):
    """A /proc/stat with the whole machine's line and one line per CPU: (user, idle, steal)."""
    lines = []
    for i, (user, idle, steal) in enumerate(cpus):
        lines.append(f"cpu{i} {user} 0 0 {idle} 0 0 0 {steal} 0 0")
    total = [sum(c[0] for c in cpus), sum(c[1] for c in cpus), sum(c[2] for c in cpus)]
    (tmp_path / "stat").write_text(
        f"cpu  {total[0]} 0 0 {total[1]} 0 0 0 {total[2]} 0 0\n" + "\n".join(lines)
    )


def test_the_freest_allowed_core_is_the_one_other_processes_used_least(tmp_path):
    _stat(tmp_path, [(100, 100, 0), (100, 100, 0), (100, 100, 0)])
    before = narrow.core_busy(tmp_path)
    assert before == {0: (200.0, 100.0, 0.0), 1: (200.0, 100.0, 0.0), 2: (200.0, 100.0, 0.0)}
    # CPU 0 ran a busy loop, CPU 1 half, CPU 2 nothing
    _stat(tmp_path, [(200, 100, 0), (150, 150, 0), (100, 200, 0)])
    after = narrow.core_busy(tmp_path)
    assert narrow.freest(before, after, {0, 1, 2}) == 2
    assert narrow.freest(before, after, {0, 1}) == 1  # only the cores this process may use
    assert narrow.freest(before, after, {0, 1, 2, 7}) == 2  # a CPU /proc did not list is skipped
    assert narrow.freest(before, before, {0, 1}) is None  # no time passed: nothing to tell
    assert narrow.core_busy(tmp_path / "missing") == {}


def test_a_pinned_process_sees_its_own_core_only(tmp_path):
    """measure.noise.on_core: other processes' share is what ran on our core besides us and our
    children; a busy loop on another core is not counted, one on ours is."""
    _stat(tmp_path, [(100, 100, 0), (100, 100, 0)])
    at = (1, narrow.core_busy(tmp_path)[1])
    ours_before, ours_after = (10.0, {}), (50.0, {77: 30.0})  # we used 40 jiffies, a child of ours 30
    # CPU 0: a hog all along (not counted); CPU 1: 100 jiffies, 70 of them ours and our child's
    _stat(tmp_path, [(200, 100, 0), (180, 120, 0)])
    info = noise.on_core(at, ours_before, ours_after, {}, {}, tmp_path)
    assert info["core"] == 1 and info["others_cpu_share"] == 0.1 and info["steal_share"] == 0.0
    assert not noise.busy_info(info) and not noise.busy_info(info, LLAMACPP_CHECK_POLICY, threads=2, cpus=2)
    # A hog on our core: 100 jiffies, 70 of them not ours; the hypervisor took 20 more
    _stat(tmp_path, [(200, 100, 0), (250, 130, 20)])
    info = noise.on_core(at, ours_before, (20.0, {}), {}, {}, tmp_path)
    assert info["others_cpu_share"] == pytest.approx(140 / 200, abs=1e-3)
    assert info["steal_share"] == pytest.approx(20 / 200, abs=1e-3)
    assert noise.busy_info(info, CHECK_POLICY)


CHILD = """
import json, os, sys, torch
from specdec_tune.measure import narrow, noise
before = (sorted(os.sched_getaffinity(0)), torch.get_num_threads())
where = narrow.take(watch_s=0.05)
pinned = {t.name: sorted(os.sched_getaffinity(int(t.name))) for t in __import__('pathlib').Path('/proc/self/task').iterdir()}
snap = noise.os_snapshot()
sum(i * i for i in range(200000))
seen = noise.os_since(snap)
during = (narrow.pinned_core(), torch.get_num_threads(), sorted({c for v in pinned.values() for c in v}))
narrow.release(where)
print(json.dumps({"before": before, "core": where.core, "threads_before": where.threads_before,
                  "during": during, "seen_core": seen.get("core"),
                  "after": [sorted(os.sched_getaffinity(0)), torch.get_num_threads()]}))
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin"
)
def test_take_pins_every_thread_to_one_core_and_release_gives_the_machine_back():
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    allowed, threads = got["before"]
    assert got["core"] in allowed and got["threads_before"] == threads
    pinned, slice_threads, cores = got["during"]
    assert pinned == got["core"] and slice_threads == narrow.SLICE_THREADS and cores == [got["core"]]
    assert got["seen_core"] == got["core"]  # the OS's window speaks of that core alone
    assert got["after"] == [allowed, threads]
