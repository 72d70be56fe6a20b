"""The one atomic writer: new files honour the umask, replaced files keep their mode, temp names
cannot be planted, named writers (GGUF) go through it too, and the engine-auto memory keeps every
concurrent writer's entry."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from specdec_tune.atomic import atomic_path, atomic_write_bytes, atomic_write_text, lock_file, locked
from specdec_tune.errors import SpecDecError


@pytest.fixture
def umask():
    """Set the process umask for one test and put the old one back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664), (0o077, 0o600)]
)
def test_a_new_file_gets_what_the_umask_allows(tmp_path, umask, mask, expected):
    umask(mask)
    atomic_write_text(tmp_path / "p.yaml", "x: 1\n")
    with atomic_path(tmp_path / "m.gguf") as tmp:
        tmp.write_bytes(b"GGUF")
    assert _mode(tmp_path / "p.yaml") == expected
    assert _mode(tmp_path / "m.gguf") == expected  # not mkstemp's 0600


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "p.yaml"
    path.write_text("old")
    path.chmod(0o600)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o600


def test_atomic_path_replaces_only_on_success_and_leaves_no_temp(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert path.read_bytes() == b"old"
    with atomic_path(path) as tmp:
        assert tmp.parent == path.parent and tmp.name.startswith(".m.gguf.")
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_an_unwritable_folder_is_a_specdec_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(SpecDecError, match="cannot write"):
            atomic_write_bytes(folder / "x.png", b"png")
    finally:
        folder.chmod(0o700)


def test_the_per_category_plot_is_written_atomically(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from helpers import make_sample_profile

    from specdec_tune.output import categories
    from specdec_tune.store.schema import CategoryRow

    p = make_sample_profile()
    p.category_table = [CategoryRow("code", 4, p.best, 1.1), CategoryRow("chat", 4, p.best, 1.2)]
    calls = []
    real = categories.atomic_write_bytes
    monkeypatch.setattr(
        categories, "atomic_write_bytes", lambda path, data: calls.append(path) or real(path, data)
    )
    path = categories.write_category_plot(p, tmp_path / "plots")
    assert calls == [path] and path.read_bytes().startswith(b"\x89PNG")
    assert sorted(f.name for f in path.parent.iterdir()) == ["per_category.png"]


# ------------------------------------------------------------------ the engine-auto memory


def test_a_planted_temp_name_is_never_followed(tmp_path):
    """The old writer used `<file>.<pid>.tmp`: a link planted there would have been written through."""
    from specdec_tune.runtime.caches import auto

    victim = tmp_path / "victim"
    victim.write_text("keep me")
    path = tmp_path / "engine-auto.json"
    os.symlink(victim, path.with_suffix(f".{os.getpid()}.tmp"))
    auto._remember(path, "cpu:X:1", "static")
    assert victim.read_text() == "keep me"
    assert json.loads(path.read_text()) == {"cpu:X:1": "static"}
    assert not path.is_symlink()


def _remember_many(path: str, worker: int, n: int) -> None:
    from specdec_tune.runtime.caches import auto

    for i in range(n):
        auto._remember(Path(path), f"cpu:w{worker}:{i}", "eager" if i % 2 else "static")


def test_concurrent_writers_of_the_auto_memory_lose_no_entry(tmp_path):
    """Each writer re-reads under the file lock before it adds its entry, so none is overwritten by
    another's stale copy (without the lock, four writers of 25 entries each lose some)."""
    path = tmp_path / "engine-auto.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_remember_many, args=(str(path), w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    known = json.loads(path.read_text())
    assert len(known) == 100 and all(f"cpu:w{w}:{i}" in known for w in range(4) for i in range(25))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine-auto.json"]  # the lock is in the cache


def test_locked_excludes_another_process(tmp_path):
    """While one process holds the lock, another's non-blocking try fails; after it, it succeeds."""
    import fcntl

    path = tmp_path / "p.yaml"
    lock = lock_file(path)

    def try_lock(conn) -> None:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            conn.send(True)
        except BlockingIOError:
            conn.send(False)
        finally:
            os.close(fd)

    ctx = multiprocessing.get_context("fork")
    results = []
    with locked(path):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=try_lock, args=(child,))
        p.start()
        results.append(parent.recv())
        p.join(30)
    parent, child = ctx.Pipe()
    p = ctx.Process(target=try_lock, args=(child,))
    p.start()
    results.append(parent.recv())
    p.join(30)
    assert results == [False, True]


def test_a_lock_lives_in_the_cache_and_two_spellings_of_a_path_share_it(tmp_path, monkeypatch):
    """A run leaves no `.<name>.lock` among a checkout's profiles (`git status` showed them): the
    lock file is in the cache folder, keyed by the resolved path, so `./p.yaml` and its absolute
    spelling serialise against each other."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "profiles"
    monkeypatch.chdir(tmp_path)
    with locked(Path("profiles") / "p.yaml"):
        atomic_write_text(folder / "p.yaml", "x: 1\n")
    assert sorted(p.name for p in folder.iterdir()) == ["p.yaml"]
    assert lock_file(Path("profiles/p.yaml")) == lock_file(folder / "p.yaml")
    assert lock_file(folder / "p.yaml").parent == tmp_path / "cache" / "specdec-tune" / "locks"
    assert lock_file(folder / "p.yaml").is_file()
    assert lock_file(folder / "q.yaml") != lock_file(folder / "p.yaml")
