"""PNG plots of a profile: speedup vs gamma per draft, per-position acceptance, the cost curve,
predicted vs measured. matplotlib is imported lazily and draws on the Agg canvas (no pyplot, no
global backend), so tables work without it installed. Reads data, never measures.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import atomic_write_bytes
from ..errors import SpecDecError
from ..search.costmodel import CostModel
from ..store.schema import Profile
from .envelope import ENVELOPE_PLOTS, plot_context, plot_gamma_context
from .trials import completed_trials, read_trials

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# What a plot function returns when it drew something: x label, y label, title.
Labels = tuple[str, str, str]

PLOT_FILES = {
    "speedup": "speedup_vs_gamma.png",
    "acceptance": "acceptance_per_position.png",
    "costs": "cost_curve.png",
    "predicted": "predicted_vs_measured.png",
    "batch": "speedup_vs_batch_size.png",
    "gamma_batch": "gamma_vs_batch_size.png",
    **ENVELOPE_PLOTS,
}


def write_plots(profile: Profile, out_dir: str | Path, trials_csv: Path | None = None) -> list[Path]:
    """Write the PNG plots whose data the profile (and optional trials CSV) holds; returns their paths.

    Plots: speedup vs γ per draft, per-position acceptance, cost curve, predicted vs measured speedup.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise SpecDecError("plots need matplotlib: pip install 'specdec-tune[plot]'") from None

    trials = completed_trials(read_trials(trials_csv)) if trials_csv is not None else []
    out_dir = Path(out_dir)
    written = []
    for key, draw in [
        ("speedup", lambda ax: _plot_speedup(ax, profile, trials)),
        ("acceptance", lambda ax: _plot_acceptance(ax, profile)),
        ("costs", lambda ax: _plot_costs(ax, profile)),
        ("predicted", lambda ax: _plot_predicted(ax, profile)),
        ("batch", lambda ax: _plot_batch(ax, profile)),
        ("gamma_batch", lambda ax: _plot_gamma_batch(ax, profile)),
        ("context", lambda ax: plot_context(ax, profile)),
        ("gamma_context", lambda ax: plot_gamma_context(ax, profile)),
    ]:
        # a Figure on its own Agg canvas: no pyplot, no global backend switch, nothing left open
        fig = Figure(figsize=(7, 4.5), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        labels = draw(ax)
        if labels is None:
            continue
        xlabel, ylabel, title = labels
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
        fig.suptitle(f"{profile.target.name} on {profile.hardware.get('slug')}", fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        path = out_dir / PLOT_FILES[key]
        atomic_write_bytes(path, buf.getvalue())
        written.append(path)
    return written


def _colors(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(dict.fromkeys(names))}


def _plot_speedup(ax: Axes, p: Profile, trials: list[dict[str, Any]]) -> Labels | None:
    results = [r for r in [p.best, *p.alternatives] if r.config.gamma > 0]
    drafts = p.costs.drafts if p.costs else []
    names = [d.name for d in drafts] + [t["draft"] for t in trials] + [r.config.draft.name for r in results]
    if not drafts and not trials and len(results) < 2:
        return None
    color = _colors(names)
    for d in drafts:
        curve = CostModel(p.costs).curve(d.name)  # type: ignore[arg-type]
        if curve:
            ax.plot(
                *zip(*curve, strict=True), "-", color=color[d.name], alpha=0.8, label=f"{d.name} (cost model)"
            )
    by_draft: dict[str, list[tuple[int, float]]] = {}
    for t in trials:
        by_draft.setdefault(t["draft"], []).append((t["gamma"], t["speedup"]))
    for name, points in by_draft.items():
        ax.scatter(*zip(*points, strict=True), s=14, color=color[name], alpha=0.45, label=f"{name} (trials)")
    for r in results:
        is_best = r is p.best
        ax.scatter(
            r.config.gamma,
            r.metrics.speedup,
            marker="*" if is_best else "D",
            s=220 if is_best else 36,
            color=color[r.config.draft.name],
            edgecolors="black",
            linewidths=0.7,
            zorder=4 if is_best else 3,
            label=f"best: {r.config.label}" if is_best else None,
        )
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="baseline")
    return (
        "γ (draft tokens per step)",
        "speedup over plain decoding",
        "Speedup vs γ per draft (◆ alternatives)",
    )


def _plot_acceptance(ax: Axes, p: Profile) -> Labels | None:
    drawn = False
    drafts = p.costs.drafts if p.costs else []
    color = _colors([d.name for d in drafts] + [p.best.config.draft.name])
    for d in drafts:
        if d.acceptance_vector:
            xs = range(1, len(d.acceptance_vector) + 1)
            ax.plot(
                xs,
                d.acceptance_vector,
                "o-",
                color=color[d.name],
                label=f"{d.name} (profiler; empty position = rejected)",
            )
            drawn = True
    measured = p.best.metrics.per_position_acceptance
    if measured:
        xs = range(1, len(measured) + 1)
        ax.plot(
            xs,
            measured,
            "s--",
            color=color[p.best.config.draft.name],
            label=f"best {p.best.config.label} (measured, given a proposal)",
        )
        drawn = True
    if not drawn:
        return None
    ax.set_ylim(0, 1.02)
    return "draft position i", "acceptance at position i", "Per-position acceptance"


def _plot_costs(ax: Axes, p: Profile) -> Labels | None:
    c = p.costs
    if c is None or not c.verify_ms:
        return None
    gammas = list(range(1, len(c.verify_ms) + 1))
    ax.plot(gammas, c.verify_ms, "o-", color="black", label="C_ver(γ): verify γ drafts")
    ax.axhline(c.t_target_ms, color="grey", linestyle=":", label=f"T_target = {c.t_target_ms:.2f} ms")
    color = _colors([d.name for d in c.drafts])
    for d in c.drafts:
        ax.plot(
            gammas, [g * d.t_draft_ms for g in gammas], "--", color=color[d.name], label=f"γ·T_draft {d.name}"
        )
    return "γ", "ms per step", "Cost curve: verification vs drafting"


def _plot_predicted(ax: Axes, p: Profile) -> Labels | None:
    points = [
        (r.metrics.predicted_speedup, r.metrics.speedup, r.config.label, r is p.best)
        for r in [p.best, *p.alternatives]
        if r.metrics.predicted_speedup is not None
    ]
    # Each batch size's best config, predicted at that batch size from the cost surface.
    points += [
        (
            row.best.metrics.predicted_speedup,
            row.best.metrics.speedup,
            f"B={row.batch_size}: {row.best.config.label}",
            False,
        )
        for row in p.batch_table
        if row.batch_size != 1 and row.best.metrics.predicted_speedup is not None
    ]
    if not points:
        return None
    for pred, meas, label, is_best in points:
        ax.scatter(pred, meas, marker="*" if is_best else "o", s=160 if is_best else 40, zorder=3)
        ax.annotate(label, (pred, meas), textcoords="offset points", xytext=(5, 4), fontsize=7)
    values = [v for pred, meas, _, _ in points for v in (pred, meas)]
    # keep speedup 1 in view: which side of it a point lies on is the whole story
    low, high = min(*values, 1.0) * 0.95, max(*values, 1.0) * 1.05
    ax.plot([low, high], [low, high], color="grey", linestyle=":", label="y = x (perfect prediction)")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    return "predicted speedup (cost model)", "measured speedup", "Cost model: predicted vs measured"


def _plot_batch(ax: Axes, p: Profile) -> Labels | None:
    rows = p.batch_table
    if len(rows) < 2:
        return None
    sizes = [r.batch_size for r in rows]
    names = [r.config.draft.name for row in rows for r in row.per_draft]
    color = _colors(names)
    ax.plot(sizes, [r.best.metrics.speedup for r in rows], "k*-", markersize=10, label="best config per B")
    for name in dict.fromkeys(names):
        points = [
            (row.batch_size, r.metrics.speedup)
            for row in rows
            for r in row.per_draft
            if r.config.draft.name == name
        ]
        ax.plot(
            *zip(*points, strict=True), "o--", color=color[name], alpha=0.8, label=f"{name} at its best γ"
        )
    predicted = [(r.batch_size, r.predicted_speedup) for r in rows if r.predicted_speedup is not None]
    if predicted:
        ax.plot(*zip(*predicted, strict=True), ":", color="grey", label="cost model (best config)")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    if p.b_star:
        ax.axvline(p.b_star, color="red", linestyle="--", linewidth=1, label=f"B* = {p.b_star}")
    ax.set_xscale("log", base=2)
    return "batch size B (requests in flight)", "speedup over plain batched decoding", "Speedup vs batch size"


def _plot_gamma_batch(ax: Axes, p: Profile) -> Labels | None:
    rows = p.batch_table
    if len(rows) < 2:
        return None
    ax.plot(
        [r.batch_size for r in rows],
        [r.best.config.gamma for r in rows],
        "ko-",
        label="γ*(B) of the best config",
    )
    ax.set_xscale("log", base=2)
    return "batch size B", "γ* (0 = no speculation)", "Best γ per batch size"
