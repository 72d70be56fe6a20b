"""The llama.cpp backend keeps every timed request's counters (both sides) on its measurement,
measured against fake servers that answer with fixed `timings`: no llama-server, no model."""

from __future__ import annotations

from typing import Any

from specdec_tune.domain import Config
from specdec_tune.measure.llamacpp import backend as be
from specdec_tune.measure.llamacpp.args import parse_llamacpp_draft


class FakeServer:
    """Answers /completion with the same tokens on both sides and fixed timings per side; keeps
    every request it got."""

    def __init__(self, binary: Any, args: list[str], threads: Any = None) -> None:
        self.args = args
        self.spec = "--spec-type" in args
        self.alive = False
        self.bodies: list[dict[str, Any]] = []  # completions
        self.slots: list[str] = []  # slot saves and restores (measure.llamacpp.states)
        self.held: dict[int, str] = {}  # the prompt state each slot holds, as LlamaServer keeps it
        self.proc = None  # no process: nothing of its threads to watch (measure.preemption)

    def start(self) -> None:
        self.alive = True
        self.held.clear()

    def stop(self) -> None:
        self.alive = False

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
        if path.startswith("/slots/"):
            self.slots.append(path.split("action=")[1])
            return {}
        self.bodies.append(body)
        n = int(body["n_predict"])
        timings = {"predicted_n": n, "predicted_ms": 10.0 * n}
        if self.spec:
            timings = {"predicted_n": n, "predicted_ms": 6.0 * n, "draft_n": 12, "draft_n_accepted": 5}
        return {"tokens": list(range(n)), "timings": timings}


def fake_backend(monkeypatch) -> tuple[be.LlamaCppBackend, list[FakeServer]]:
    started: list[FakeServer] = []

    def server(*a: Any, **k: Any) -> FakeServer:
        started.append(FakeServer(*a, **k))
        return started[-1]

    monkeypatch.setattr(be, "find_server", lambda binary=None: "llama-server")
    monkeypatch.setattr(be, "build_info", lambda binary: {"binary_sha256": "0"})
    monkeypatch.setattr(be, "LlamaServer", server)
    return be.LlamaCppBackend("target.gguf", threads=1), started


def test_a_measurement_carries_each_timed_requests_counters(monkeypatch):
    backend, started = fake_backend(monkeypatch)
    case = be.TextCase(["a", "b"], [16, 24])
    config = Config(parse_llamacpp_draft("ngram-simple:4"), 8)
    (m,) = backend.measure([config], case, batch_size=1, repeats=3)
    # 3 repeats x 2 prompts per side; the warm-up (exactness) and reference requests are not timed
    sides = [r.side for r in m.requests]
    assert sides.count("plain") == 6 and sides.count("spec") == 6
    spec = [r for r in m.requests if r.side == "spec"]
    assert [r.n_predict for r in spec] == [16, 24] * 3
    assert all(r.draft_n == 12 and r.draft_accepted == 5 and r.batch_size == 1 for r in spec)
    assert [r.predicted_ms for r in spec] == [96.0, 144.0] * 3
    plain = [r for r in m.requests if r.side == "plain"]
    assert all(r.draft_n == 0 and r.predicted_ms == 10.0 * r.predicted_n for r in plain)
    # the existing fields and keys are as before, "requests" added
    d = m.as_dict()
    assert d["requests"][0] == m.requests[0].as_dict()
    assert {"speedup", "tokens", "mismatches", "speedups", "exactness", "flags"} <= set(d)
    assert abs(m.metrics.speedup - 10.0 / 6.0) < 1e-9 and m.mismatches == 0
    # no extra request: per side, the reference or exactness pass, then the timed ones
    spec_server = next(s for s in started if s.spec)
    assert len(spec_server.bodies) == 2 + 6
    # each prompt was processed once, in the plain server (its state saved), and restored before
    # every request of the speculative one
    assert spec_server.slots == ["restore"] * 8
    plain_server = next(s for s in started if not s.spec)
    assert plain_server.slots.count("save") == 2 and [b["n_predict"] for b in plain_server.bodies[:1]] == [1]

    (base,) = backend.measure([Config(config.draft, 0)], case, 1, 2)
    assert [r.side for r in base.requests] == ["plain"] * 4
