"""measure.llamacpp.states without a server: the first meeting of a prompt processes and saves it,
every later one restores it; one file per prompt text; the folder goes at close."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

from specdec_tune.measure.llamacpp.server import ServerError
from specdec_tune.measure.llamacpp.states import (
    PREFIX,
    STATE_SEQ_MAGIC,
    STATE_SEQ_VERSION,
    PromptStates,
    state_name,
    sweep_orphans,
    widen,
)

ONE_SLOT = struct.pack("<III2II", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, 2, 7, 8, 1) + b"CELLS"


class Server:
    def __init__(self, *args: str, folder: Path | None = None, saves: bytes = ONE_SLOT) -> None:
        self.args = list(args)  # the server's flags, as LlamaServer.args
        self.posts: list[tuple[str, dict]] = []
        self.held: dict[int, str] = {}
        self.folder, self.saves, self.refuses = folder, saves, False

    def post(self, path: str, body: dict) -> dict:
        self.posts.append((path, body))
        if self.folder is not None and path.endswith("action=save"):
            (self.folder / body["filename"]).write_bytes(self.saves)  # as a one-slot server saves
        if self.refuses and path.endswith("action=restore"):
            raise ServerError("llama-server answered 400 to /slots/2?action=restore")
        return {}


def test_a_prompt_is_processed_and_saved_once_then_restored():
    states = PromptStates()
    processed = []
    a, b = Server(), Server()
    try:
        assert states.flags() == ["--slot-save-path", str(states.folder)]
        states.restore(a, "long prompt", lambda srv, p, n, slot: processed.append((srv, p, n)))
        states.restore(b, "long prompt", lambda srv, p, n, slot: processed.append((srv, p, n)))
        states.restore(b, "other prompt", lambda srv, p, n, slot: processed.append((srv, p, n)))
        assert processed == [(a, "long prompt", 1), (b, "other prompt", 1)]
        (save,) = a.posts
        assert save[0] == "/slots/0?action=save"
        assert [p for p, _ in b.posts] == ["/slots/0?action=restore", "/slots/0?action=save"]
        assert b.posts[0][1] == save[1]  # the file the first server saved
        assert b.posts[1][1] != save[1]  # another prompt, another file
    finally:
        states.close()
    assert not states.folder.exists()


def test_a_server_with_a_draft_model_processes_each_prompt_itself():
    """A saved state holds the target's KV cache alone: a server that runs a draft model is never
    given one, and none is saved from it; it processes the prompt (with the cache on) every time."""
    states = PromptStates()
    processed = []
    plain, drafted = Server(), Server("-m", "t.gguf", "--spec-draft-model", "d.gguf")
    try:
        states.restore(plain, "long prompt", lambda srv, p, n, slot: processed.append((srv, p, n)))
        states.restore(drafted, "long prompt", lambda srv, p, n, slot: processed.append((srv, p, n)))
        states.restore(drafted, "long prompt", lambda srv, p, n, slot: processed.append((srv, p, n)))
        assert processed == [
            (plain, "long prompt", 1),
            (drafted, "long prompt", 1),
            (drafted, "long prompt", 1),
        ]
        assert drafted.posts == [] and [p for p, _ in plain.posts] == ["/slots/0?action=save"]
    finally:
        states.close()


def test_a_folder_left_by_a_killed_process_is_swept_and_a_live_ones_is_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    orphan = tmp_path / f"{PREFIX}{int(dead.stdout)}-abc"
    mine = tmp_path / f"{PREFIX}{__import__('os').getpid()}-def"
    other = tmp_path / "unrelated"
    for d in (orphan, mine, other):
        d.mkdir()
        (d / "x.bin").write_bytes(b"state")
    assert sweep_orphans(tmp_path) == [orphan]
    assert not orphan.exists() and mine.exists() and other.exists()


def test_a_one_slot_state_is_widened_to_another_layout_and_a_held_prompt_is_not_restored_again():
    """A one-slot state restored as it is into a -np 4 server answers 400: it is widened (its
    stream count set to 4, three empty streams after its one) and restored, not processed again.
    `hold` restores only when the slot took another prompt last."""
    states = PromptStates()
    processed = []
    a, b = Server(folder=states.folder), Server(folder=states.folder)
    try:
        states.restore(a, "p", lambda srv, p, n, slot: processed.append((srv, p, slot)))
        assert states.saved("p", 1) and not states.saved("p", 4)
        states.hold(b, "p", lambda srv, p, n, slot: processed.append((srv, p, slot)), 2, 4)
        assert processed == [(a, "p", 0)] and states.saved("p", 4)  # not processed for the new layout
        name = state_name("p", 4)
        assert b.posts == [("/slots/2?action=restore", {"filename": name})]
        head = ONE_SLOT[: -len(b"CELLS") - 4]
        assert (states.folder / name).read_bytes() == head + struct.pack("<I", 4) + b"CELLS" + bytes(12)
        states.hold(b, "p", lambda *x: processed.append(x), 2, 4)  # slot 2 holds it: nothing
        states.hold(b, "p", lambda *x: processed.append(x), 3, 4)  # slot 3 does not: restored
        assert len(processed) == 1 and b.posts[-1] == ("/slots/3?action=restore", {"filename": name})
        assert b.held == {2: name, 3: name}
    finally:
        states.close()


def test_a_state_that_cannot_be_widened_is_processed_for_its_layout():
    """A header `widen` does not know (another version, or a state of several streams), or a server
    that refuses the widened file: the prompt is processed in the slot and saved for that layout."""
    other_version = struct.pack("<III2II", STATE_SEQ_MAGIC, STATE_SEQ_VERSION + 1, 2, 7, 8, 1) + b"CELLS"
    two_streams = ONE_SLOT.replace(struct.pack("<I", 1) + b"CELLS", struct.pack("<I", 2) + b"CELLS")
    for saves, refuses in ((other_version, False), (two_streams, False), (ONE_SLOT, True)):
        states = PromptStates()
        processed: list[tuple] = []
        a, b = Server(folder=states.folder, saves=saves), Server(folder=states.folder)
        b.refuses = refuses

        def process(srv, p, n, slot, seen=processed):
            seen.append((srv, p, slot))

        try:
            states.restore(a, "p", process)
            states.hold(b, "p", process, 2, 4)
            assert processed == [(a, "p", 0), (b, "p", 2)], (saves, refuses)
            assert b.posts[-1] == ("/slots/2?action=save", {"filename": state_name("p", 4)})
            assert not widen(states.folder / "absent.bin", states.folder / "x.bin", 4)
        finally:
            states.close()


def test_a_pass_keeps_each_slot_on_its_prompts_and_restores_only_on_a_change():
    """closedloop: 2 prompts at B = 4 give every slot one prompt (no restore once primed); 3
    prompts at B = 2 switch a slot's prompt, each switch a restore, never a prefill; a server with a
    draft model is never restored into."""
    from specdec_tune.measure.llamacpp.cases import TextCase
    from specdec_tune.measure.llamacpp.closedloop import closed_loop, prime, sent_tokens, slot_lanes

    # what a pass asks for, which the budget scales a two-prompt timing by (LlamaCppSession.pass_seconds)
    assert sent_tokens(TextCase(["a", "b"], [8, 16]), 1) == 24
    assert sent_tokens(TextCase(["a", "b"], [8, 16]), 4) == 4 * 8 + 4 * 16
    assert sent_tokens(TextCase(list("abcdefghi"), [8] * 9), 4) == 9 * 8

    assert slot_lanes([("a", 8), ("b", 8)], 4) == [
        [("a", 8)] * 2,
        [("b", 8)] * 2,
        [("a", 8)] * 2,
        [("b", 8)] * 2,
    ]
    lanes = slot_lanes([("a", 8), ("b", 8), ("c", 8)], 2)
    assert lanes == [[("a", 8), ("c", 8)], [("b", 8), ("a", 8)]]
    assert sum(map(len, slot_lanes([("a", 8)] * 9, 4))) == 9  # a long workload is sent once

    states = PromptStates()
    sent: list[tuple[str, int]] = []

    def send(srv, p, n, slot):
        sent.append((p, slot))
        return n

    try:
        server = Server()
        prime(server, slot_lanes([("a", 8), ("b", 8)], 4), 4, states, send)
        assert sent == [("a", 0), ("b", 1)]  # each prompt processed once, in the first slot it starts
        restores = [p for p, _ in server.posts if "restore" in p]
        assert restores == ["/slots/2?action=restore", "/slots/3?action=restore"]
        before = len(server.posts)
        replies = closed_loop(server, slot_lanes([("a", 8), ("b", 8)], 4), 4, states, send)
        assert replies == [8] * 8 and len(server.posts) == before  # every slot held its prompt

        server = Server()
        prime(server, lanes, 2, states, send)
        before = len(server.posts)
        closed_loop(server, lanes, 2, states, send)
        switches = sorted(p for p, _ in server.posts[before:])
        assert switches == ["/slots/0?action=restore", "/slots/1?action=restore"]  # c into 0, a into 1

        drafted = Server("--spec-draft-model", "d.gguf")  # no state restored into it: it processes
        sent.clear()
        prime(drafted, lanes, 2, states, send)
        closed_loop(drafted, lanes, 2, states, send)
        assert drafted.posts == [] and len(sent) == 2 + 4
    finally:
        states.close()
