"""The options of `tune` beside the models (`Models`: what is measured) and the search's own settings
(`search.space.TuneSettings`): what the search starts from, where the answer is measured, and what
the run may spend. `specdec-tune run` builds them from its flags; the Python API takes the same."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SearchInputs:
    """What the search starts from beside the models' drafts: extra layer-skip drafts, and the costs
    its cost model seeds and predicts with (`run --layer-skip`, `--costs`, `--no-profile`)."""

    layer_skip: list[int] | None = None  # also search layer-skip with these numbers of layers
    costs_file: Path | None = None  # costs from `specdec-tune profile --out` instead of profiling
    no_profile: bool = False  # no costs at all: no cost model, no seeding


@dataclass(frozen=True)
class Envelope:
    """Where the answer is measured (`run --batch-sizes`, `--context-lengths`): each batch size (requests
    in flight), and with context lengths each (batch size, prompt length in the target's tokens) cell."""

    batch_sizes: list[int] | None = None  # None: the settings' batch size alone
    context_lengths: list[int] | None = None  # None: the workload's prompts as written


@dataclass(frozen=True)
class RunLimits:
    """What a run may spend (`run --budget`, `--workers`): wall-clock seconds for the whole run when
    the settings fix no trial count (None: no budget), and local worker processes on one study."""

    budget_s: float | None = None
    workers: int = 1
