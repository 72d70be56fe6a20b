"""Prompt states saved once and restored into every server that measures the same prompt.

Every config is measured in its own llama-server, and a server holds only the prompts it processed
itself. At a long context that prompt processing is what a trial costs: 2 prompts of 6 107 tokens
took 127 s to decode 1 024 tokens in one server, most of it two prefills, against a share of 80 s
for the whole length's search. A slot's state (its KV cache and tokens) saved from the first server
that processed a prompt (`/slots/K?action=save`) is restored into the next (`action=restore`): at
2 100 tokens 48 MB in 14 ms, against 10.8 s to process the prompt again, with the same tokens and
drafts after it (docs/llamacpp.md). A server with a draft model is the exception: the state holds no
draft context, so it processes each prompt itself.

A state restores only into a server of the same slot layout: one slot (`-np 1`, llama-server's KV
cache unified) or several (one KV stream per slot): restoring a one-slot state into a slot of a
`-np 4` server answers 400 "No available space in KV cache or invalid slot save file" (build
11434). So states are kept per layout (`layout`: the server's slot count), each prompt processed
once per layout.

Nothing timed changes: B = 1 tokens/s come from the server's decode timings, which begin after the
prompt. Every B = 1 request, plain or speculative, timed or an exactness check, is sent the same
way (its state restored, then the prompt with the cache on: the server evaluates its last token
again), so both sides of a comparison meet the prompt alike. At B > 1 each client keeps to one slot
(`hold`): a slot that already holds the prompt reuses it, any other gets its state restored
(measure.llamacpp.backend). `--slot-save-path` is a flag of the measuring harness, never of a
config: it changes no computation and is not in the exported flags.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .args import DRAFT_MODEL_FLAG
from .server import LlamaServer

PREFIX = "specdec-slots-"


class PromptStates:
    """A folder of saved slot states, one per prompt text, removed by `close`; a folder left by a
    process that was killed (its pid in the name, no longer alive) is removed by the next one."""

    def __init__(self) -> None:
        sweep_orphans()
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self._saved: set[str] = set()

    def flags(self) -> list[str]:
        """The flags a server needs to save and restore into this folder."""
        return ["--slot-save-path", str(self.folder)]

    def restore(
        self, server: LlamaServer, prompt: str | list[Any], complete: Any, slot: int = 0, layout: int = 1
    ) -> None:
        """Put `prompt`'s state into `slot` of `server` (a server of `layout` slots): restored when
        some server of that layout saved it, else processed here (`complete(server, prompt, 1,
        slot)`, the prompt cache on) and saved for the next."""
        name = state_name(prompt, layout)
        if DRAFT_MODEL_FLAG in server.args:
            # A slot's saved state holds the target's KV cache alone: restored into a server with a
            # draft model, the draft has no context and the first speculative batch fails (500,
            # "failed to process speculative batch"; build 11434). Such a server processes the
            # prompt itself, target and draft, with the prompt cache on, as a new request would.
            complete(server, prompt, 1, slot)
        elif name in self._saved:
            server.post(f"/slots/{slot}?action=restore", {"filename": name})
        else:
            complete(server, prompt, 1, slot)
            server.post(f"/slots/{slot}?action=save", {"filename": name})
            self._saved.add(name)
        server.held[slot] = name

    def hold(
        self, server: LlamaServer, prompt: str | list[Any], complete: Any, slot: int, layout: int
    ) -> None:
        """`restore` unless `slot` of `server` already holds `prompt` (it was the slot's last prompt:
        the server reuses it with the prompt cache on)."""
        if server.held.get(slot) != state_name(prompt, layout):
            self.restore(server, prompt, complete, slot, layout)

    def saved(self, prompt: str | list[Any], layout: int) -> bool:
        """Whether some server of `layout` slots saved `prompt`'s state."""
        return state_name(prompt, layout) in self._saved

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self._saved.clear()


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Remove the state folders under `root` (the temp folder) whose process is gone; returns them."""
    gone = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = d.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def state_name(prompt: str | list[Any], layout: int = 1) -> str:
    """The state file of `prompt` in a server of `layout` slots."""
    text = prompt if isinstance(prompt, str) else repr(prompt)
    return hashlib.sha256(text.encode()).hexdigest()[:32] + ("" if layout == 1 else f"-np{layout}") + ".bin"
