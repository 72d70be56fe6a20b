"""The use cases over stored files: `export` a profile to an engine's settings, `show` it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.schema import Profile

# --------------------------------------------------------------------------------- export, show


@dataclass
class ExportResult:
    engine: str
    settings: Any  # a dict (hf, vllm) or an argv list (llamacpp, sglang); None / [] when nothing
    text: str  # what to paste: JSON or a shell-quoted command line
    warnings: list[str] = field(default_factory=list)


def export(path: Path, to: str = "hf") -> ExportResult:
    """A stored profile's best config as one serving engine's settings; gaps are in `warnings`."""
    from ..output.export import export_profile, export_settings
    from ..store.yamlio import load_profile

    p = load_profile(path)
    settings, warnings = export_settings(p, to)
    text, _ = export_profile(p, to)
    return ExportResult(to.strip().lower(), settings, text, warnings)


@dataclass
class ShowResult:
    profile: Profile
    other: Profile | None = None  # `compare`
    trials: Any = None  # the trials CSV as a pandas DataFrame, when there is one
    plots: list[Path] = field(default_factory=list)


def show(
    path: Path, compare: Path | None = None, trials: Path | None = None, plot: Path | None = None
) -> ShowResult:
    """Load a profile (and another to compare with), its trials CSV (the one beside it unless
    `trials` names one), and write PNG plots into `plot`."""
    from ..output.trials import read_trials
    from ..store.yamlio import load_profile

    p = load_profile(path)
    other = load_profile(compare) if compare is not None else None
    csv = trials or path.with_suffix(".trials.csv")
    if trials is None and not csv.is_file():
        csv = None
    df = read_trials(csv) if csv is not None else None
    written = []
    if plot is not None:
        from ..output.plots import write_plots

        written = write_plots(p, plot, csv)
    return ShowResult(p, other, df, written)
