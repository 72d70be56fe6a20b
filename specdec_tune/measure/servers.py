"""Engine servers on loopback, whatever the engine: start a command on a free port, wait for its
health endpoint, send JSON, read its log's tail, and stop its whole process group.

Every server runs in its own process group with a parent-death signal, and a guard process
(measure.children.guard_group) kills the whole group when the command ends without stopping it, so
no server, nor any process it started, outlives the command (also after kill -9 of that command);
`close_all` stops the ones still up on exit, and `servers_die_with_us` turns SIGTERM into Ctrl-C
for a block so its `finally` clauses run. A server that dies or hangs raises `ServerError` with its log's tail. An engine's own server
(llama-server, vLLM's OpenAI server) subclasses `EngineServer` with its command and its calls.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from .children import die_with_parent, guard_group, release_group

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _child_of(parent: int) -> Any:
    """A server's preexec function: killed when `parent` dies (and at once when it died before this
    ran), with the stop signals the parent held off unblocked."""

    def preexec() -> None:
        die_with_parent()
        if os.getppid() != parent:
            os._exit(1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)

    return preexec


class ServerError(RuntimeError):
    """A server failed to start, died, or stopped answering: the trial fails with this message."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LIVE: weakref.WeakSet[EngineServer] = weakref.WeakSet()


@dataclass(eq=False)
class EngineServer:
    """One server process: `command()` is its argv without host and port, `label` names it in
    messages. Subclasses say how the engine is started and what else it answers."""

    label = "server"
    health_path = "/health"
    stop_grace_s = 5.0  # SIGTERM, then SIGKILL after this long

    port: int = field(default=0, init=False)
    log_path: Path | None = field(default=None, init=False, repr=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    env: dict[str, str] | None = field(default=None, init=False, repr=False)

    def command(self) -> list[str]:
        raise NotImplementedError

    def died_of(self, returncode: int | None) -> str:
        """What an exit code says beyond the log (the signal that killed it)."""
        if returncode is None or returncode >= 0:
            return ""
        try:
            return f" (killed by {signal.Signals(-returncode).name})"
        except ValueError:
            return f" (killed by signal {-returncode})"

    def start(self, timeout_s: float, port: int | None = None, tries: int = 3) -> None:
        """Start and wait for the health endpoint; a port taken in between is retried on another one."""
        last = ""
        for _ in range(tries):
            self.port = port or free_port()
            port = None
            fd, log = tempfile.mkstemp(prefix=f"specdec-{self.label.split()[0].lower()}-", suffix=".log")
            self.log_path = Path(log)
            # Ctrl-C or SIGTERM held off until the child is known to close_all: one arriving while
            # Popen forks would leave a server no one stops (seen: a vLLM server outliving a `bench`
            # interrupted at its start); the child unblocks them before it execs.
            held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
            try:
                self.proc = subprocess.Popen(
                    [*self.command(), "--host", "127.0.0.1", "--port", str(self.port)],
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stopped as a whole
                    preexec_fn=_child_of(os.getpid()),
                    env=self.env,
                )
                _LIVE.add(self)
            finally:
                os.close(fd)
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            guard_group(self.proc.pid)  # its whole group dies with us, its engine's own children too
            try:
                self._wait_healthy(timeout_s)
                return
            except ServerError as exc:
                last = str(exc)
                self.stop()
                if "bind" not in last.lower() and "address" not in last.lower():
                    raise
        raise ServerError(last)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc.returncode if self.proc is not None else None
                raise ServerError(f"{self.label} exited at start-up{self.died_of(code)}: {self.log_tail()}")
            try:
                status, _ = self.call("GET", self.health_path, None, timeout_s=2.0)
                if status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        raise ServerError(f"{self.label} not healthy after {timeout_s:.0f} s: {self.log_tail()}")

    def call(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
        """One HTTP request: (status, the JSON reply, or its text when it is not JSON)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            try:
                return resp.status, json.loads(data) if data else None
            except ValueError:
                return resp.status, data.decode("utf-8", "replace")
        finally:
            conn.close()

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
        """POST JSON; a dead server, a timeout or an error status raise `ServerError`."""
        try:
            status, data = self.call("POST", path, body, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            dead = self.proc is None or self.proc.poll() is not None
            why = "died" if dead else f"did not answer ({type(exc).__name__}: {exc})"
            raise ServerError(f"{self.label} {why}: {self.log_tail()}") from None
        if status != 200 or not isinstance(data, dict):
            raise ServerError(f"{self.label} answered {status} to {path}: {str(data)[:300]}")
        return data

    def log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            text = ""
        tail = [ln.strip() for ln in text.strip().splitlines()[-lines:]]
        return " | ".join(tail) or "(no log)"

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after `stop_grace_s`."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if proc is not None:
            # children that left the group's leader behind (an engine's workers) go with it, and
            # are waited for: a command's end is no server's (a `pgrep` right after a vLLM run
            # found an engine core and its worker still exiting)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _wait_group_gone(proc.pid, self.stop_grace_s)
            release_group(proc.pid)
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
            self.log_path = None
        _LIVE.discard(self)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def live_in_group(pgid: int) -> list[int]:
    """The processes of group `pgid` still alive (a zombie is not: only its reaping is left), read
    from /proc; [] where there is none to read."""
    out = []
    proc_root = Path("/proc")
    for d in proc_root.iterdir() if proc_root.is_dir() else ():
        if not d.name.isdigit():
            continue
        try:
            state, _, group = (d / "stat").read_text().rsplit(") ", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            out.append(int(d.name))
    return out


def group_cpu_ticks(pgids: set[int]) -> int:
    """CPU time (user + system, in clock ticks) that the live processes of the groups `pgids` have
    used so far, read from /proc; 0 where there is none to read."""
    total = 0
    proc_root = Path("/proc")
    for d in proc_root.iterdir() if pgids and proc_root.is_dir() else ():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 12 and fields[2].isdigit() and int(fields[2]) in pgids:
            total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
    return total


IDLE_WINDOW_S = 0.1  # how long a window of `wait_groups_idle` is
IDLE_TICKS = 1  # CPU ticks a window may hold and still count as idle (a busy core: 10 at 100 Hz)


def wait_groups_idle(pgids: set[int], quiet_windows: int = 1, cap_s: float = 5.0) -> float:
    """Wait until the groups `pgids` used at most IDLE_TICKS of CPU in each of `quiet_windows`
    windows in a row, at most `cap_s`; the seconds waited."""
    started = time.monotonic()
    if not pgids:
        return 0.0
    quiet, before = 0, group_cpu_ticks(pgids)
    while quiet < quiet_windows and time.monotonic() - started < cap_s:
        time.sleep(IDLE_WINDOW_S)
        now = group_cpu_ticks(pgids)
        quiet = quiet + 1 if now - before <= IDLE_TICKS else 0
        before = now
    return time.monotonic() - started


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait until no process of group `pgid` is alive (`live_in_group`), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while live_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def close_all() -> None:
    """Stop every server this process started that is still up."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


@contextlib.contextmanager
def servers_die_with_us() -> Any:
    """For the block: SIGTERM ends it like Ctrl-C (finally blocks run, servers stop), and any
    server still up at its end is stopped."""
    previous = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread: no handler, close_all still runs
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        close_all()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
