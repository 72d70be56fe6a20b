"""What the use cases share: the models they load and the progress callbacks (backends.base), the
noise adaptation of the final round, the check that an output path is writable, the bench result."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.base import Models, Progress
from ..domain import Config, Noise
from ..errors import SpecDecError
from ..measure.noise import Snapshot, busy, during_line, machine_window, noise_line
from ..measurement import Measurement
from ..measurepolicy import MEASURE_POLICY
from ..search.space import TuneSettings
from ..store.schema import Profile

if TYPE_CHECKING:
    from ..search.results import TuneResult

__all__ = ["Models", "Progress"]


def check_writable(path: Path) -> None:
    """Fail before minutes of measuring, not after, when the output cannot be written."""
    folder = path.parent if str(path.parent) else Path(".")
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if path.is_dir() or not os.access(probe, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecDecError(f"cannot write {path}: choose a writable file path")
    # os.access says yes to root everywhere, /proc included: a file created and removed at once
    # in the deepest folder that exists is what says it (the folders below it are made later).
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".specdec-probe-"):
            pass
    except OSError as exc:
        raise SpecDecError(
            f"cannot write {path}: {exc.strerror or exc}; choose a writable file path"
        ) from None


@dataclass
class BenchResult:
    target: str
    draft: str
    gamma: int
    threshold: float
    temperature: float
    workload: str
    prompts: int
    device: str
    measurement: Measurement
    hf: dict[str, Any] | None = None  # transformers' assisted generation, with `compare_hf`
    # per category of the workload (batch 1, two categories or more): acceptance and speedup
    categories: list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("target", "draft", "gamma", "threshold", "temperature")}
        d |= {"workload": self.workload, "prompts": self.prompts, "device": self.device}
        d |= self.measurement.as_dict()
        if self.hf is not None:
            d["hf"] = self.hf
        if self.categories:
            d["categories"] = self.categories
        return d


MAX_FINAL_REPEATS = 32  # what the noise may raise the final round's racing to


def adapt_to_noise(settings: TuneSettings, noise: Noise) -> tuple[TuneSettings, str]:
    """More final-round repeats where the noise needs them (the budget still caps the racing),
    and one line for the user when the noise is above what the planned repeats resolve."""
    line = noise_line(noise, settings.final_max_repeats)
    if noise.repeats_needed > settings.final_repeats and settings.finalists:
        settings = replace(
            settings,
            final_repeats_asked=settings.final_repeats_asked or settings.final_repeats,
            final_repeats=max(settings.final_repeats, MEASURE_POLICY.min_pairs + 1),
            final_max_repeats=max(settings.final_max_repeats, min(noise.repeats_needed, MAX_FINAL_REPEATS)),
        )
        if line and settings.final_repeats_cap is not None:
            line += f"; --final-repeats caps the final round at {settings.final_repeats_cap} repeats"
        elif line:
            line += f"; the final round races up to {settings.final_max_repeats} within the budget"
    return settings, line


def watched(
    noise: Noise, snapshot: Snapshot, progress: Progress, rule: Callable[[dict[str, Any]], bool] | None = None
) -> Noise:
    """`noise` (domain.Noise) with what the OS said since `snapshot` (measure.noise.os_snapshot,
    taken before the search) as `during_search`; one line for the user when the machine turned
    busy after the noise passes had found it quiet. `rule`: what counts as busy (machine_window)."""
    window = machine_window(snapshot, rule=rule)
    line = during_line(window)
    if line and not busy(noise):
        progress.note(line)
    return replace(noise, during_search=window)


@dataclass
class TuneOutcome:
    profile: Profile
    path: Path  # the profile YAML written
    trials_csv: Path  # one row per trial, beside it
    result: TuneResult  # of the first (smallest) batch size
    by_batch: dict[int, TuneResult] = field(default_factory=dict)  # every batch size's


def trial_params(config: Config) -> dict[str, Any]:
    """A config as trial params (what the study enqueues)."""
    if config.gamma == 0:
        return {"draft": "none"}
    params: dict[str, Any] = {"draft": config.draft.name, "gamma": config.gamma}
    if config.draft.has_threshold:
        params["threshold"] = config.threshold
    if config.gamma_policy != "fixed":
        params["gamma_policy"] = config.gamma_policy
    return params
