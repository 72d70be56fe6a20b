"""`run --workers N`: N local processes work on one study, each pinned to its share of the cores.

This process is one of the workers; it starts N-1 others with the same settings, and they meet in
the study exactly as workers on several machines do. Each gets len(cores) // N cores and as many
engine threads (`Models.threads`), so all of them describe the same hardware (the thread count is part of a CPU's
hardware slug) and share one study name. On a small machine this only helps a target that leaves
cores idle (I/O or GPU bound); a CPU-bound target just splits the same cores N ways.

The children write their output to log files (the parent reports the last line of a failed
child's log), run in process groups of their own and die with the parent (a parent-death
signal). SIGTERM of the parent ends the run like Ctrl-C: the children are stopped (SIGTERM, then
SIGKILL after `STOP_GRACE_S`), the job files (they hold the storage URL) removed, exit 130.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from ..errors import SpecDecError
from ..measure.children import die_with_parent
from ..search.space import TuneSettings
from ..search.storage import check_url
from ..search.study import default_storage
from .common import Models, Progress
from .run_options import Envelope, RunLimits, SearchInputs
from .tuning import TuneOutcome, tune

CHILD = "from specdec_tune.app.workers import child; child()"
STOP_GRACE_S = 10.0  # a child stopped with SIGTERM gets this long to end its trial, then SIGKILL


def core_shares(workers: int) -> list[list[int]]:
    """Each worker's cores: equal shares of this process's CPUs (a remainder stays idle)."""
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    share = len(cores) // workers
    if share < 1:
        raise SpecDecError(f"--workers {workers} is more than the {len(cores)} CPU cores here")
    return [cores[i * share : (i + 1) * share] for i in range(workers)]


def _pin(models: Models, cores: list[int]) -> Models:
    """This process on `cores`, and `models` with as many engine threads (the session sets them)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    return dataclasses.replace(models, threads=len(cores))


def tune_workers(
    models: Models,
    settings: TuneSettings,
    limits: RunLimits,
    inputs: SearchInputs | None = None,
    out: Path | None = None,
    progress: Progress | None = None,
    envelope: Envelope | None = None,
) -> TuneOutcome:
    """`app.tune` on `limits.workers` local processes sharing one study, within `limits.budget_s`;
    returns this process's outcome."""
    workers, budget_s = limits.workers, limits.budget_s
    inputs, envelope = inputs or SearchInputs(), envelope or Envelope()
    if workers < 1:
        raise SpecDecError(f"--workers must be >= 1, got {workers}")
    if envelope.context_lengths and workers > 1:
        raise SpecDecError(
            "--context-lengths searches one length after another in one process: drop --workers"
        )

    def here(settings: TuneSettings, progress: Progress | None, models: Models = models) -> TuneOutcome:
        return tune(models, settings, inputs, out, progress, envelope=envelope, budget_s=budget_s)

    if workers == 1:
        return here(settings, progress)
    shares = core_shares(workers)
    settings = dataclasses.replace(settings, storage=settings.storage or default_storage())
    check_url(settings.storage)
    progress = progress or Progress()
    children: list[tuple[subprocess.Popen, Path]] = []
    with tempfile.TemporaryDirectory(prefix="specdec-workers-") as tmp, _term_is_interrupt():
        try:
            for i, cores in enumerate(shares[1:], start=1):
                job = {
                    "models": dataclasses.asdict(models),
                    # the reference processes are this process's (app.reference), once
                    "settings": dataclasses.asdict(dataclasses.replace(settings, reference_processes=0)),
                    "layer_skip": inputs.layer_skip,
                    "costs_file": str(inputs.costs_file) if inputs.costs_file else None,
                    "no_profile": inputs.no_profile,
                    "out": str(Path(tmp) / f"worker{i}.yaml"),  # this process writes the real one
                    "cores": cores,
                    "batch_sizes": envelope.batch_sizes,
                    "budget_s": budget_s,
                    "parent": os.getpid(),
                }
                path = Path(tmp) / f"worker{i}.json"
                _write_private(path, json.dumps(job))
                log = Path(tmp) / f"worker{i}.log"
                with open(log, "wb") as f:  # a file, never a pipe: a chatty child cannot block
                    p = subprocess.Popen(
                        [sys.executable, "-c", CHILD, str(path)],
                        stdin=subprocess.DEVNULL,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its own process group: stopped as a whole
                    )
                children.append((p, log))
            outcome = here(settings, progress, _pin(models, shares[0]))
            for i, (p, log) in enumerate(children, start=1):
                p.wait()
                if p.returncode != 0:
                    progress.note(f"worker {i} exited with code {p.returncode}: {last_line(log)}")
            return outcome
        finally:
            with _signals_ignored():
                stop(children)


def _write_private(path: Path, text: str) -> None:
    """A new file only its owner can read (it names the storage, password included)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1].strip() if lines else "no message"


def stop(children: list[tuple[subprocess.Popen, Path]], grace_s: float = STOP_GRACE_S) -> None:
    """Stop every child still running, with its process group: SIGTERM, SIGKILL after `grace_s`."""
    alive = [p for p, _ in children if p.poll() is None]
    for p in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in alive:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@contextlib.contextmanager
def _term_is_interrupt() -> Iterator[None]:
    """For the block: SIGTERM ends it like Ctrl-C (KeyboardInterrupt, so finally blocks run)."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = None
    with contextlib.suppress(ValueError):  # not the main thread: no handler
        previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """For the block (stopping the children): a second SIGTERM or Ctrl-C does not cut it short."""
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):
            previous[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _die_with(parent: int) -> None:
    """Tie this process to its parent: killed when the parent dies (Linux), gone at once if the
    parent died before that could be set."""
    die_with_parent()
    if os.getppid() != parent:
        os._exit(1)


def child() -> None:
    """A worker started by `tune_workers`: its job is a JSON file named in argv."""
    path = Path(sys.argv[1])
    job: dict[str, Any] = json.loads(path.read_text())
    with contextlib.suppress(OSError):
        path.unlink()  # the storage URL stays on disk no longer than needed
    _die_with(job["parent"])
    models = _pin(Models(**job["models"]), job["cores"])
    settings = job["settings"]
    settings["grid_thresholds"] = tuple(settings["grid_thresholds"])
    with contextlib.suppress(ValueError):  # SIGTERM from the parent: end the trial like Ctrl-C

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, on_term)
    try:
        inputs = SearchInputs(
            job["layer_skip"], Path(job["costs_file"]) if job["costs_file"] else None, job["no_profile"]
        )
        tune(
            models, TuneSettings(**settings), inputs, Path(job["out"]), None,
            envelope=Envelope(job.get("batch_sizes")), budget_s=job.get("budget_s"),
        )  # fmt: skip
    except SpecDecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
