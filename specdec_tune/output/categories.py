"""The per-category answers and a hybrid's per-source counters as rich tables, and the per-category
plot. Reads data, never measures."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.table import Table

from ..atomic import atomic_write_bytes
from ..domain import Metrics
from ..store.schema import Profile
from .fmt import num, times


def category_table(profile: Profile) -> Table | None:
    """Best config per category, measured, beside the overall best measured on the same prompts."""
    if not profile.category_table:
        return None
    t = Table(title="Per category (measured on each category's prompts)", title_justify="left")
    for col in ("category", "prompts", "best here", "speedup", "α", "overall best", "gain"):
        t.add_column(col, justify="left" if col in ("category", "best here") else "right")
    for row in profile.category_table:
        m = row.best.metrics
        gain = m.speedup / row.overall_speedup if row.overall_speedup > 0 else None
        t.add_row(
            row.category,
            str(row.prompts),
            row.best.config.label,
            times(m.speedup),
            num(m.acceptance_rate),
            times(row.overall_speedup),
            "—" if gain is None else f"{(gain - 1) * 100:+.1f}%",
        )
    t.caption = f"overall best: {profile.best.config.label}"
    return t


def per_source_table(metrics: Metrics, title: str = "Who proposed what (hybrid drafter)") -> Table | None:
    if not metrics.per_source:
        return None
    t = Table(title=title, title_justify="left")
    for col in ("source", "proposed", "accepted", "α", "share of drafts"):
        t.add_column(col, justify="left" if col == "source" else "right")
    for name, c in metrics.per_source.items():
        t.add_row(
            name,
            f"{c.get('proposed', 0):.0f}",
            f"{c.get('accepted', 0):.0f}",
            num(c.get("acceptance_rate")),
            f"{100 * c.get('share', 0.0):.0f}%",
        )
    return t


def bench_categories_table(rows: list[dict[str, Any]]) -> Table | None:
    if not rows:
        return None
    t = Table(title="Per category", title_justify="left")
    for col in ("category", "prompts", "speedup", "α", "τ"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for r in rows:
        t.add_row(
            r["category"],
            str(r["prompts"]),
            times(r["speedup"]),
            num(r["acceptance_rate"]),
            num(r["mean_accepted_len"]),
        )
    return t


def write_category_plot(profile: Any, folder: Path) -> Path | None:
    """Bars per category: the category's best and the overall best, both measured there."""
    if not profile.category_table:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = profile.category_table
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(rows)), 3.5))
    ax.bar([i - 0.2 for i in x], [r.overall_speedup for r in rows], 0.4, label="overall best")
    ax.bar([i + 0.2 for i in x], [r.best.metrics.speedup for r in rows], 0.4, label="best for the category")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), [r.category for r in rows], rotation=20)
    ax.set_ylabel("speedup over plain decoding")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    path = folder / "per_category.png"
    atomic_write_bytes(path, buf.getvalue())
    return path
