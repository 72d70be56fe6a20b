"""measure.llamacpp.states without a server: the first meeting of a prompt processes and saves it,
every later one restores it; one file per prompt text; the folder goes at close."""

from __future__ import annotations

import subprocess
import sys

from specdec_tune.measure.llamacpp.states import PREFIX, PromptStates, sweep_orphans


class Server:
    def __init__(self, *args: str) -> None:
        self.args = list(args)  # the server's flags, as LlamaServer.args
        self.posts: list[tuple[str, dict]] = []

    def post(self, path: str, body: dict) -> dict:
        self.posts.append((path, body))
        return {}


def test_a_prompt_is_processed_and_saved_once_then_restored():
    states = PromptStates()
    processed = []
    a, b = Server(), Server()
    try:
        assert states.flags() == ["--slot-save-path", str(states.folder)]
        states.restore(a, "long prompt", lambda srv, p, n: processed.append((srv, p, n)))
        states.restore(b, "long prompt", lambda srv, p, n: processed.append((srv, p, n)))
        states.restore(b, "other prompt", lambda srv, p, n: processed.append((srv, p, n)))
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
        states.restore(plain, "long prompt", lambda srv, p, n: processed.append((srv, p, n)))
        states.restore(drafted, "long prompt", lambda srv, p, n: processed.append((srv, p, n)))
        states.restore(drafted, "long prompt", lambda srv, p, n: processed.append((srv, p, n)))
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
