"""Shared fixtures: tiny offline model pairs built in memory and saved to temp folders."""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile

import pytest

# No test reads or writes the real home: everything that reaches it (the remembered `auto` engine
# mode, the inductor cache, the HF cache) points into one temp folder for the whole session, set
# before anything imports the package.
_HOME = tempfile.mkdtemp(prefix="specdec-tune-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["HOME"] = _HOME
os.environ["XDG_CACHE_HOME"] = os.path.join(_HOME, ".cache")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_HOME, ".cache", "inductor")
os.environ["HF_HOME"] = os.path.join(_HOME, ".cache", "huggingface")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# `run` ends with fresh processes measuring its best as `check` does (app.reference): seconds each,
# so the suite's runs skip them; tests/store/test_reference.py runs them on purpose.
os.environ["SPECDEC_REFERENCE_PROCESSES"] = "0"

torch = pytest.importorskip("torch")
from helpers import VOCAB, noisy_copy, save_pair, tiny_llama, tiny_tokenizer  # noqa: E402

# Tiny models gain nothing from intra-op threads, and threads make tests slow on a busy 2-core box.
torch.set_num_threads(1)


# ---------------------------------------------------------------- two tests at once, or one alone
# The README's command runs the suite in two pytest-xdist workers, two tests at a time. A test marked
# `alone` runs an engine on every core and judges what it measured (llama-server's threads, whose
# verdicts and anchors moved beside another test; torch.compile's builds, 4-5x slower beside one):
# it waits until the other worker's test ends, and no test starts beside it. A readers-writer lock
# on two files both workers share: every test holds RUN shared, an `alone` test holds it exclusive;
# an `alone` test takes GATE exclusive first, so a worker starting test after test queues behind it
# instead of starving it. Without xdist (one test at a time) there is nothing to wait for.


@pytest.fixture(scope="session")
def _lock_dir(tmp_path_factory):
    """The folder both xdist workers share (their base temp folders' parent), or None alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return tmp_path_factory.getbasetemp().parent


@pytest.fixture(autouse=True)
def _alone_or_beside(request, _lock_dir):
    if _lock_dir is None:
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with open(_lock_dir / "gate.lock", "a+") as gate, open(_lock_dir / "run.lock", "a+") as run:
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_draft(tiny_target):
    return noisy_copy(tiny_target, 0.02)


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(7)
    out = [torch.randint(1, VOCAB - 1, (n,), generator=g).tolist() for n in (1, 5, 12, 30)]
    # A repetitive prompt so prompt lookup finds matches.
    out.append([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7])
    return out


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tiny_target, tiny_draft):
    """Folders: target, draft (agrees often), other-vocab draft, and a workload JSONL."""
    import json

    root = tmp_path_factory.mktemp("models")
    paths = save_pair(root, tiny_target, tiny_draft)
    other = tiny_llama(layers=1, vocab=80, seed=3)
    p = root / "other"
    other.save_pretrained(p)
    tiny_tokenizer(80).save_pretrained(p)
    paths["other"] = str(p)
    g = torch.Generator().manual_seed(11)
    lines = []
    for n in (6, 9, 4):
        ids = torch.randint(2, VOCAB - 1, (n,), generator=g).tolist()
        lines.append(json.dumps({"prompt": " ".join(f"w{i}" for i in ids), "category": "test"}))
    wl = root / "workload.jsonl"
    wl.write_text("\n".join(lines) + "\n")
    paths["workload"] = str(wl)
    return paths


@pytest.fixture(params=["eager", "static"])
def ctx(request):
    """The execution context an exactness test runs under: every engine mode whose cache differs
    (compiled adds torch.compile over the static cache; test_modes covers it), so a mode-specific
    crash cannot hide behind whatever mode the machine's `auto` picks."""
    from specdec_tune.runtime.caches.modes import ExecutionContext

    return ExecutionContext(request.param, 256)


@pytest.fixture
def fake_engine(monkeypatch):
    """The scripted third backend of tests/fake_backend.py, registered as `fake` for one test, its
    script reset (tests/test_fake_backend.py, tests/test_envelope.py)."""
    import fake_backend as fake

    from specdec_tune.backends import base

    monkeypatch.setitem(base._REGISTERED, fake.NAME, fake.FakeModule)
    monkeypatch.setitem(fake.SCRIPT, "build", dict(fake.BUILD))
    monkeypatch.setitem(fake.SCRIPT, "slowdown", 1.0)
    monkeypatch.setitem(fake.SCRIPT, "measured", [])
    monkeypatch.setitem(fake.SCRIPT, "budgets", [])
    monkeypatch.setitem(fake.SCRIPT, "screened", [])
    monkeypatch.setitem(fake.SCRIPT, "carried", [])
    monkeypatch.setitem(fake.SCRIPT, "renews", False)
    monkeypatch.setitem(fake.SCRIPT, "renewed", 0)
    monkeypatch.setattr(fake.FakeModule, "sessions", [])
    return fake
