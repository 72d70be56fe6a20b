"""Real `specdec-tune run` processes for the multi-process tests, instrumented through
`tests/worker_hooks/sitecustomize.py` (final rounds counted, a chosen process made to hang at a
chosen point), and the checks on them: trial states, no process left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import tiny_args

HOOKS = Path(__file__).resolve().parents[1] / "worker_hooks"
# The checkout under test before any installed copy: the hooks import the package at start-up,
# before Python puts the working folder on the path.
ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "import sys; from specdec_tune.cli import app; sys.argv = ['specdec-tune', *sys.argv[1:]]; app()"


def run_args(tiny_dirs, storage, trials=12):
    return tiny_args(
        tiny_dirs,
        "--draft",
        tiny_dirs["draft"],
        "--draft",
        "prompt-lookup",
        "--trials",
        str(trials),
        "--max-gamma",
        "3",
        "-n",
        "6",
        "--repeats",
        "1",
        "--finalists",
        "2",
        "--final-repeats",
        "1",
        "--no-profile",
        "--storage",
        storage,
        "--study-name",
        "shared",
    )


def start(args, out, marks, hang="", until_go=False, grace_s=3, together=0):
    """`specdec-tune run ARGS --out OUT --json`; `hang` (e.g. "trial:2", "slot:2", "final") makes
    the first process of the test to get there stop there (see worker_hooks/sitecustomize.py)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
        "MARKS": str(marks),
        "HANG": hang,
        "HANG_UNTIL_GO": "1" if until_go else "",
        "TOGETHER": str(together or ""),
        "SPECDEC_HEARTBEAT_S": "1",
        "SPECDEC_GRACE_S": str(grace_s),
        "SPECDEC_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, "run", *args, "--out", str(out), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def final_rounds(marks):
    """The final rounds measured (worker_hooks): [{"pid", "finalists"}, ...]."""
    return [json.loads(f.read_text()) for f in sorted(Path(marks).glob("final-*"))]


def states(study):
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def wait_for(path: Path, procs, timeout_s: float = 300) -> str:
    """The contents of `path` once it exists; fails if a process ends first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        for p in procs:
            assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)
    return path.read_text()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for a reaper has stopped: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _procs():
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            yield p


def started(marks: Path) -> dict[int, dict]:
    """Every instrumented process the test started: pid -> {"pgid", "argv"}."""
    return {int(f.name[4:]): json.loads(f.read_text()) for f in marks.glob("pid-*")}


def assert_no_orphans(marks: Path, timeout_s: float = 15) -> None:
    """No process the test started still runs, nor any in the process group of one that leads its
    own (a `--workers` child); a process killed with its parent may take a moment to go."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [
            pid
            for pid, info in started(marks).items()
            if alive(pid) or (info["pgid"] == pid and _group_alive(pid))
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"still running: {left}"


def _group_alive(pgid: int) -> bool:
    for p in _procs():
        try:
            if os.getpgid(int(p.name)) == pgid and alive(int(p.name)):
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False
