"""measure.servers: a stopped server's whole process group is gone when `stop` returns, its
children that outlive the group's leader included (an engine core and its workers)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdec_tune.measure.servers import EngineServer, _wait_group_gone, live_in_group

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")


# A "server" whose leader exits on SIGTERM at once, leaving two children that ignore it: only the
# group's SIGKILL stops them, and `stop` returns once they are gone.
SCRIPT = """
import os, signal, socket, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
for _ in range(2):
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
        os._exit(0)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@dataclass(eq=False)
class Children(EngineServer):
    label = "children server"

    def command(self) -> list[str]:
        return [sys.executable, "-c", SCRIPT]


def test_stop_returns_once_the_servers_whole_group_is_gone():
    server = Children()
    server.start(60.0)
    pgid = server.proc.pid
    assert len(live_in_group(pgid)) == 3  # the leader and its two children
    server.stop()
    assert live_in_group(pgid) == []


def test_waiting_for_a_group_ends_at_its_timeout():
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        _wait_group_gone(p.pid, 0.3)  # still alive: returns after the timeout, no error
        assert live_in_group(p.pid) == [p.pid]
    finally:
        p.kill()
        p.wait()
    _wait_group_gone(p.pid, 5.0)
    assert live_in_group(p.pid) == []


def test_waiting_for_server_groups_to_be_idle_waits_out_a_busy_one_and_not_an_idle_one():
    """measure.servers.wait_groups_idle, on real process groups read from /proc: a group spinning
    for 0.6 s is waited out; a sleeping one (a vLLM server between requests) costs one window."""
    from specdec_tune.measure.servers import IDLE_WINDOW_S, group_cpu_ticks, wait_groups_idle

    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.6:\n    pass\ntime.sleep(30)\n"
    busy = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        time.sleep(0.3)  # both started; the busy one is spinning
        ticks = group_cpu_ticks({busy.pid})
        waited = wait_groups_idle({busy.pid})
        assert group_cpu_ticks({busy.pid}) > ticks  # it used CPU while waited for
        assert 0.15 <= waited < 3.0  # the rest of its 0.6 s spin, then one quiet window
        assert wait_groups_idle({idle.pid}) < IDLE_WINDOW_S + 0.5
        assert wait_groups_idle(set()) == 0.0 and group_cpu_ticks(set()) == 0
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


# A command that starts that server and is then killed with SIGKILL: no `finally`, no `close_all`.
COMMAND = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_servers import Children
server = Children()
server.start(60.0)
print(server.proc.pid, flush=True)
import time
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's")
def test_a_killed_command_takes_its_servers_whole_group_along():
    """The parent-death signal reaches only the server's first process; its own children (vLLM's
    engine core and workers, here the two forked sleepers) go with the guard process
    (measure.children.guard_group) when the command that started them dies of SIGKILL."""
    import os
    import signal

    command = subprocess.Popen([sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, text=True)
    pgid = int(command.stdout.readline())
    try:
        assert len(live_in_group(pgid)) == 3
        command.send_signal(signal.SIGKILL)
        command.wait(10)
        _wait_group_gone(pgid, 10.0)
        assert live_in_group(pgid) == []
    finally:
        if live_in_group(pgid):
            os.killpg(pgid, signal.SIGKILL)
