"""`run --workers N`: N local processes work on one study, each pinned to its share of the cores.

This process is one of the workers; it starts N-1 others with the same settings, and they meet in
the study exactly as workers on several machines do. Each gets len(cores) // N cores and as many
torch threads, so all of them describe the same hardware (the thread count is part of a CPU's
hardware slug) and share one study name. On a small machine this only helps a target that leaves
cores idle (I/O or GPU bound); a CPU-bound target just splits the same cores N ways.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import SpecDecError
from ..search.space import TuneSettings
from ..search.storage import check_url
from ..search.study import default_storage
from .common import Models, Progress
from .tuning import TuneOutcome, tune

CHILD = "from specdec_tune.app.workers import child; child()"


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


def _pin(cores: list[int]) -> None:
    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


def tune_workers(
    models: Models,
    settings: TuneSettings,
    workers: int,
    layer_skip: list[int] | None = None,
    costs_file: Path | None = None,
    no_profile: bool = False,
    out: Path | None = None,
    progress: Progress | None = None,
    batch_sizes: list[int] | None = None,
    budget_s: float | None = None,
) -> TuneOutcome:
    """`app.tune` on `workers` local processes sharing one study; returns this process's outcome."""
    import tempfile

    if workers < 1:
        raise SpecDecError(f"--workers must be >= 1, got {workers}")
    if workers == 1:
        return tune(
            models, settings, layer_skip, costs_file, no_profile, out, progress, batch_sizes, budget_s
        )
    shares = core_shares(workers)
    settings = dataclasses.replace(settings, storage=settings.storage or default_storage())
    check_url(settings.storage)
    progress = progress or Progress()
    children: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="specdec-workers-") as tmp:
        try:
            for i, cores in enumerate(shares[1:], start=1):
                job = {
                    "models": dataclasses.asdict(models),
                    "settings": dataclasses.asdict(settings),
                    "layer_skip": layer_skip,
                    "costs_file": str(costs_file) if costs_file else None,
                    "no_profile": no_profile,
                    "out": str(Path(tmp) / f"worker{i}.yaml"),  # this process writes the real one
                    "cores": cores,
                    "batch_sizes": batch_sizes,
                    "budget_s": budget_s,
                }
                path = Path(tmp) / f"worker{i}.json"
                path.write_text(json.dumps(job))
                p = subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(path)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                children.append(p)
            _pin(shares[0])
            outcome = tune(
                models, settings, layer_skip, costs_file, no_profile, out, progress, batch_sizes, budget_s
            )
            for i, p in enumerate(children, start=1):
                err = p.communicate()[1]
                if p.returncode != 0:
                    last = (err.strip().splitlines() or ["no message"])[-1]
                    progress.note(f"worker {i} exited with code {p.returncode}: {last}")
            return outcome
        finally:
            for p in children:
                if p.poll() is None:
                    p.terminate()
                    p.wait()


def child() -> None:
    """A worker started by `tune_workers`: its job is a JSON file named in argv."""
    job: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    _pin(job["cores"])
    settings = job["settings"]
    settings["grid_thresholds"] = tuple(settings["grid_thresholds"])
    try:
        tune(
            Models(**job["models"]),
            TuneSettings(**settings),
            job["layer_skip"],
            Path(job["costs_file"]) if job["costs_file"] else None,
            job["no_profile"],
            Path(job["out"]),
            None,
            job.get("batch_sizes"),
            job.get("budget_s"),
        )
    except SpecDecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
