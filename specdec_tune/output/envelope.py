"""The serving envelope of a profile (`run --context-lengths`) for a person: the table of (B, L)
cells with L* and the draft kind's changes, and the plots of speedup and γ* against L, one line per
batch size. Reads data, never measures."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from rich.table import Table

from ..store.schema import BatchRow, ContextRow, Profile
from .fmt import add_columns, interval, times

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# The plots' files (output.plots.PLOT_FILES takes them in).
ENVELOPE_PLOTS = {"context": "speedup_vs_context_length.png", "gamma_context": "gamma_vs_context_length.png"}


def pays(row: ContextRow) -> bool:
    """Whether speculation pays in the cell: its best, raced against plain decoding, speculates."""
    return row.best.config.gamma > 0


def envelope_table(p: Profile) -> Table | None:
    """One row per (B, L) cell, then L* and the kind changes per batch size as the caption; None
    for a profile without the context axis."""
    if not p.context_table:
        return None
    t = Table(title="Context lengths (speedup over plain decoding at the same B and L)", title_justify="left")
    add_columns(
        t,
        [
            ("B", "right"),
            ("L", "right"),
            ("prompt tokens", "right"),
            ("best config", "left"),
            ("speedup", "right"),
            ("interval", "left"),
            ("α", "right"),
            ("T_target ms", "right"),
            ("predicted", "right"),
            ("verdict", "left"),
        ],
    )
    for row in p.context_table:
        m = row.best.metrics
        t.add_row(
            str(row.batch_size),
            str(row.context_length),
            str(row.prompt_tokens),
            cell_label(row),
            times(m.speedup),
            interval(m.speedup_interval),
            f"{m.acceptance_rate:.2f}" if row.best.config.gamma else "—",
            f"{row.t_target_ms:.2f}" if row.t_target_ms else "—",
            times(row.predicted_speedup),
            "speculation pays" if pays(row) else "does not pay",
        )
    t.caption = "; ".join(envelope_words(p) + prediction_words(p)) + confirmed_words(p.context_table)
    return t


def prediction_errors(p: Profile) -> tuple[list[float], int]:
    """|predicted / measured - 1| of each speculative config measured in a cell (each draft's best
    there) that the cost model predicted before it was measured, and how many cells they came
    from. A cell where plain decoding won counts through the configs that lost to it, never as
    plain's own prediction of 1.00x."""
    errs, cells = [], 0
    for row in p.context_table:
        found = [
            abs(r.metrics.predicted_speedup / r.metrics.speedup - 1)
            for r in row.per_draft
            if r.config.gamma > 0 and r.metrics.predicted_speedup and r.metrics.speedup > 0
        ]
        errs += found
        cells += bool(found)
    return sorted(errs), cells


def prediction_words(p: Profile) -> list[str]:
    """The cost model's error over the configs it predicted in the cells: median and worst."""
    errs, cells = prediction_errors(p)
    if not errs:
        return []
    return [
        f"cost model error over {len(errs)} configs in {cells} cells: median "
        f"{statistics.median(errs):.0%}, worst {errs[-1]:.0%}"
    ]


def envelope_words(p: Profile) -> list[str]:
    """Per batch size: L* (or that speculation paid at every L measured) and where the best draft
    kind changed along L."""
    words = []
    lengths = sorted({r.context_length for r in p.context_table})
    for line in p.envelope:
        star = (
            f"L* = {line.l_star}"
            if line.l_star is not None
            else f"pays at every L measured ({lengths[0]}-{lengths[-1]})"
        )
        changes = f", {'; '.join(line.kind_changes)}" if line.kind_changes else ""
        words.append(f"B={line.batch_size}: {star}{changes}")
    return words


def plot_context(ax: Axes, p: Profile) -> tuple[str, str, str] | None:
    """Speedup of each cell's best against L, one line per batch size, with L* marked."""
    by_b = _by_batch(p)
    if not by_b or max(len(rows) for rows in by_b.values()) < 2:
        return None
    for b, rows in by_b.items():
        ax.plot(
            [r.context_length for r in rows], [r.best.metrics.speedup for r in rows], "o-", label=f"B = {b}"
        )
        for r in rows:
            ax.annotate(r.best.config.label, (r.context_length, r.best.metrics.speedup), fontsize=6)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    for line in p.envelope:
        if line.l_star is not None:
            ax.axvline(
                line.l_star,
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"L* = {line.l_star} (B = {line.batch_size})",
            )
    ax.set_xscale("log", base=2)
    return "context length L (prompt tokens)", "speedup over plain decoding", "Speedup vs context length"


def plot_gamma_context(ax: Axes, p: Profile) -> tuple[str, str, str] | None:
    """γ* of each cell's best against L, one line per batch size."""
    by_b = _by_batch(p)
    if not by_b or max(len(rows) for rows in by_b.values()) < 2:
        return None
    for b, rows in by_b.items():
        ax.plot(
            [r.context_length for r in rows],
            [r.best.config.gamma for r in rows],
            "o-",
            label=f"γ*(L) at B = {b}",
        )
    ax.set_xscale("log", base=2)
    return "context length L", "γ* (0 = no speculation)", "Best γ per context length"


def _by_batch(p: Profile) -> dict[int, list[ContextRow]]:
    out: dict[int, list[ContextRow]] = {}
    for r in sorted(p.context_table, key=lambda r: (r.batch_size, r.context_length)):
        out.setdefault(r.batch_size, []).append(r)
    return out


def cell_label(row: BatchRow | ContextRow) -> str:
    """A cell's best config, marked † when the cell was not searched (`confirmed_words`)."""
    return row.best.config.label + (" †" if row.confirmed_from else "")


def confirmed_words(rows: list[BatchRow] | list[ContextRow]) -> str:
    """What † marks in a table of cells: not searched, another cell's top configs raced there."""
    cells = sorted({r.confirmed_from for r in rows if r.confirmed_from})
    if not cells:
        return ""
    return f"; † not searched: the top configs of {' / '.join(cells)} raced head to head against plain there"
