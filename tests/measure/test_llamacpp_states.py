"""measure.llamacpp.states without a server: the first meeting of a prompt processes and saves it,
every later one restores it; one file per prompt text; the folder goes at close."""

from __future__ import annotations

from specdec_tune.measure.llamacpp.states import PromptStates


class Server:
    def __init__(self) -> None:
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
