"""measure.children: a child started with `die_with_parent` ends when its parent is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import subprocess, sys, time
from specdec_tune.measure.children import die_with_parent
kw = {"preexec_fn": die_with_parent} if sys.argv[1] == "tied" else {}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw)
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("tied", [True, False])
def test_a_killed_parent_takes_its_child_along(tied):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, "tied" if tied else "free"], stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)  # no finally block, no handler runs
        parent.wait(10)
        # tied, the kernel kills the child at once; untied, it outlives the parent (so the test
        # can fail): a second is plenty to tell the two apart
        deadline = time.monotonic() + (10 if tied else 1)
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) != tied
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
