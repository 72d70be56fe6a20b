"""The use cases over stored files: `export` a profile to an engine's settings, `show` it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import atomic_write_text
from ..output.categories import write_category_plot
from ..output.index import INDEX_NAME, index_markdown, index_rows
from ..output.plots import write_plots
from ..output.trials import read_trials
from ..serving.export import Export as ExportResult
from ..serving.export import export as export_config
from ..store.refs import engine_path, target_ref
from ..store.runfiles import trials_beside
from ..store.schema import Profile
from ..store.yamlio import load_profile

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ExportResult", "IndexResult", "ShowResult", "export", "index_profiles", "show"]

# --------------------------------------------------------------------------------- export, show


def export(
    path: Path,
    to: str = "hf",
    engine_version: str | None = None,
    fmt: str = "command",
    batch_size: int | None = None,
    schedule: bool = True,
) -> ExportResult:
    """A stored profile's best config that engine `to` (at `engine_version`, default the current
    release) runs as measured, as a ready-to-run deployment (`fmt` "command" or "json") or the
    round-2 fragment ("flags"); `batch_size` is the load to size it for, `schedule=False` the single
    operating point for that load. A fallback and every gap are in `warnings`; `exported` is None
    (`nothing` says why) when there is nothing to export."""
    p = load_profile(path)
    folder = Path(path).parent
    return export_config(
        p,
        to,
        engine_version,
        lambda ref: engine_path(ref, folder),
        fmt=fmt,
        batch_size=batch_size,
        schedule=schedule,
        # the target `check` would load: a path that no longer exists falls back as it does there
        target=engine_path(target_ref(p), folder),
    )


@dataclass
class ShowResult:
    profile: Profile
    other: Profile | None = None  # `compare`
    trials: pd.DataFrame | None = None  # the trials CSV, when there is one
    plots: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. the CSV beside is another run's


def show(
    path: Path, compare: Path | None = None, trials: Path | None = None, plot: Path | None = None
) -> ShowResult:
    """Load a profile (and another to compare with), its trials CSV (the one beside it unless
    `trials` names one; left out, with a warning, when it is another run's), and write PNG plots
    into `plot`."""
    p = load_profile(path)
    other = load_profile(compare) if compare is not None else None
    csv, mismatch = (trials, None) if trials is not None else trials_beside(p, path)
    df = read_trials(csv) if csv is not None else None
    written = []
    if plot is not None:
        written = write_plots(p, plot, csv)
        written += [f for f in [write_category_plot(p, plot)] if f is not None]
    return ShowResult(p, other, df, written, [mismatch] if mismatch else [])


@dataclass
class IndexResult:
    path: Path  # the index written: <folder>/README.md
    rows: list[dict[str, str]]


def index_profiles(folder: Path) -> IndexResult:
    """Write the index of a folder of profiles (output.index) as `<folder>/README.md`, atomically;
    the same profiles always give the same bytes, so a test can tell when it is out of date."""
    rows = index_rows(folder)
    out = Path(folder) / INDEX_NAME
    atomic_write_text(out, index_markdown(rows))
    return IndexResult(out, rows)
