"""Test-only instrumentation of every `specdec-tune` process a fault test starts, `--workers`
children included: tests put this folder on PYTHONPATH, and Python imports `sitecustomize` at
start-up. Inert unless MARKS (a folder) is set.

- MARKS/pid-<pid>: this process is up (its process group and argv inside), for the orphan checks.
- MARKS/final-<uuid>: one per final round measured (holding the final-round lock).
- HANG=trial:N | slot:N | final: the first process of the test to get there (MARKS/hanging,
  created exclusively, holds its pid) stops there: at its N-th measured trial, right after its
  N-th acquisition of the slot lock (still holding it), or inside the final round (holding the
  final-round lock). It sleeps until killed, or with HANG_UNTIL_GO=1 until MARKS/go exists.
- TOGETHER=N: before its first trial a process waits (at most 120 s) until N processes of the
  test are that far, so a fast worker cannot finish a tiny study before a slow one has started.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path


def _install(marks: Path) -> None:
    from specdec_tune.measure import backends
    from specdec_tune.search import final, storage

    (marks / f"pid-{os.getpid()}").write_text(json.dumps({"pgid": os.getpgid(0), "argv": sys.argv}))
    kind, _, at = os.environ.get("HANG", "").partition(":")
    counts = {"trial": 0, "slot": 0}
    together = int(os.environ.get("TOGETHER") or 0)
    waited: list[bool] = []

    def start_together() -> None:
        if not together or waited:
            return
        waited.append(True)
        (marks / f"ready-{os.getpid()}").write_text("")
        deadline = time.monotonic() + 120
        while len(list(marks.glob("ready-*"))) < together and time.monotonic() < deadline:
            time.sleep(0.02)

    def hang_here() -> None:
        try:
            fd = os.open(marks / "hanging", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return  # another process hangs already
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if os.environ.get("HANG_UNTIL_GO") and (marks / "go").exists():
                return
            time.sleep(0.05)

    def count(name: str) -> None:
        counts[name] += 1
        if kind == name and counts[name] == int(at):
            hang_here()

    real_final, real_measure, real_acquire = (
        final._measure,
        backends.NativeBackend.measure,
        storage.StorageLock.acquire,
    )

    def final_measure(*a, **k):
        labels = [r.config.label for r in a[0]]  # the finalists: which round this is
        (marks / f"final-{uuid.uuid4().hex}").write_text(
            json.dumps({"pid": os.getpid(), "finalists": labels})
        )
        if kind == "final":
            hang_here()
        return real_final(*a, **k)

    def measure(self, *a, **k):
        count("trial")
        return real_measure(self, *a, **k)

    def acquire(self, *a, **k):
        if self.name.endswith(":trials"):
            start_together()
        got = real_acquire(self, *a, **k)
        if got and self.name.endswith(":trials"):
            count("slot")
        return got

    final._measure, backends.NativeBackend.measure, storage.StorageLock.acquire = (
        final_measure,
        measure,
        acquire,
    )


if os.environ.get("MARKS"):
    _install(Path(os.environ["MARKS"]))
