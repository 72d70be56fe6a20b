"""measure.servers: a stopped server's whole process group is gone when `stop` returns, its
children that outlive the group's leader included (an engine core and its workers)."""

from __future__ import annotations

import subprocess
import sys
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
