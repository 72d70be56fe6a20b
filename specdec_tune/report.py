"""Show a profile to a person: rich tables (`show`), a side-by-side of two profiles, and PNG plots.

Plots import matplotlib lazily and draw on the Agg canvas, so tables work without it installed.
Layer 5 (using): reads a Profile, never measures.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_tune.errors import SpecDecError
from specdec_tune.profile import Costs, DraftCosts, Metrics, Profile, Result, atomic_write_bytes

# ------------------------------------------------------------------------------------- numbers


def _predicted_curve(costs: Costs, draft: DraftCosts) -> list[tuple[int, float]]:
    """The cost model's speedup for γ = 1..Γ (see costmodel.predicted_speedup), overheads included.

    Γ is the shorter of the verify curve and the acceptance vector: no extrapolation in a report.
    """
    from specdec_tune.costmodel import overheads, predicted_speedup

    top = min(len(costs.verify_ms), len(draft.acceptance_vector))
    return [
        (
            g,
            predicted_speedup(
                costs.t_target_ms,
                draft.t_draft_ms,
                costs.verify_ms,
                draft.acceptance_vector,
                g,
                **overheads(costs),
            ),
        )
        for g in range(1, top + 1)
    ]


def _x(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}×"


def _f(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _vec(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values) if values else "—"


# --------------------------------------------------------------------------------------- tables


def render_profile(profile: Profile, console: Console) -> None:
    """Print the profile as tables: best, alternatives, baseline, run, hardware, costs."""
    p = profile
    console.print(
        Text.assemble(
            ("specdec-tune profile ", "bold"),
            (p.target.name, "bold cyan"),
            " on ",
            (str(p.hardware.get("slug")), "bold magenta"),
            (f"  (created {p.created or '?'}, schema {p.schema_version})", "dim"),
        )
    )
    console.print(_best_table(p))
    if p.alternatives:
        console.print(_results_table("Alternatives (next best)", p.alternatives))
        if any(a.metrics.search_speedup is not None for a in p.alternatives):
            console.print(
                "[dim]final: re-measured head to head with the best in the final round; search: one search "
                "trial, whose number runs high when it was the largest of many noisy trials.[/]"
            )
    console.print(_baseline_table(p.baseline))
    console.print(_run_table(p))
    console.print(_kv_table("Hardware", _flatten(p.hardware)))
    if p.costs is None:
        console.print("[dim]No hardware costs in this profile (run without the profiler).[/]")
    else:
        for table in _costs_tables(p.costs):
            console.print(table)


def _best_table(p: Profile) -> Table:
    best = p.best
    m = best.metrics
    cfg = best.config
    t = Table(title="Best config", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    if cfg.draft.kind == "none":
        t.add_row("config", "[yellow]no speculation: plain decoding was fastest here[/]")
    else:
        t.add_row("config", f"[bold green]{cfg.label}[/]")
        drafter = cfg.draft.label + (f"  {cfg.draft.path}" if cfg.draft.path else "")
        t.add_row("drafter", f"{cfg.draft.kind}: {drafter}")
    where = "final round" if m.search_speedup is not None else "search trial"
    t.add_row(
        "speedup",
        f"[bold]{_x(m.speedup)}[/] ({where}: spread {m.speedup_spread * 100:.1f}% max−min, {m.repeats} repeats)",
    )
    if m.search_speedup is not None:
        t.add_row("speedup in the search", f"{_x(m.search_speedup)} (one trial; the final round decides)")
    t.add_row("tokens/s", f"{m.tokens_per_s:.1f} (baseline {m.baseline_tokens_per_s:.1f} in the same run)")
    t.add_row("acceptance α", _f(m.acceptance_rate, 3))
    t.add_row("mean accepted length τ", _f(m.mean_accepted_len))
    t.add_row("per-position acceptance", _vec(m.per_position_acceptance))
    t.add_row("predicted speedup", _x(m.predicted_speedup))
    return t


def _results_table(title: str, results: list[Result]) -> Table:
    t = Table(title=title, title_justify="left")
    for name, justify in [
        ("#", "right"),
        ("config", "left"),
        ("speedup", "right"),
        ("tokens/s", "right"),
        ("α", "right"),
        ("τ", "right"),
        ("predicted", "right"),
        ("measured in", "left"),
    ]:
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, r in enumerate(results, 1):
        m = r.metrics
        t.add_row(
            str(i),
            r.config.label,
            _x(m.speedup),
            f"{m.tokens_per_s:.1f}",
            _f(m.acceptance_rate, 3),
            _f(m.mean_accepted_len),
            _x(m.predicted_speedup),
            _measured_in(m),
        )
    return t


def _measured_in(m: Metrics) -> str:
    if m.search_speedup is None:
        return "search"
    return f"final (search {_x(m.search_speedup)})"


def _baseline_table(m: Metrics) -> Table:
    t = Table(title="Baseline (plain target decoding, γ = 0)", title_justify="left")
    t.add_column("tokens/s", justify="right")
    t.add_column("spread", justify="right")
    t.add_column("repeats", justify="right")
    t.add_row(f"{m.tokens_per_s:.1f}", f"±{m.speedup_spread * 100:.1f}%", str(m.repeats))
    return t


def _run_table(p: Profile) -> Table:
    tg, w, s = p.target, p.workload, p.search
    rows = [
        ("target", f"{tg.name} ({tg.dtype}, {tg.num_params / 1e9:.2f} B params)"),
        ("target revision", f"{(tg.revision or '—')[:12]}  hash {tg.content_hash}"),
        (
            "workload",
            f"{w.name}: {w.prompts} prompts, {w.max_new_tokens} new tokens, temperature {w.temperature:g}",
        ),
        ("search", f"{s.sampler}, {s.trials} trials ({s.failed} failed, {s.pruned} pruned), seed {s.seed}"),
        (
            "final round",
            f"top {s.finalists} re-measured head to head, {s.final_repeats} interleaved repeats"
            if s.finalists
            else "none (ranked by the search trials)",
        ),
        ("study", f"{s.study_name} in {s.storage}"),
        ("versions", ", ".join(f"{k} {v}" for k, v in p.versions.items()) or "—"),
    ]
    return _kv_table("Run", rows)


def _costs_tables(c: Costs) -> list[Table]:
    summary = [
        ("T_target", f"{c.t_target_ms:.3f} ms per token (spread ±{c.t_target_spread * 100:.1f}%)"),
        ("context length", str(c.context_len)),
        ("copy bandwidth", _unit(c.copy_bandwidth_gbps, "GB/s")),
        ("decode bandwidth", _unit(c.decode_bandwidth_gbps, "GB/s")),
        ("roofline share", "—" if c.roofline_share is None else f"{c.roofline_share * 100:.0f}%"),
        ("matmul", _unit(c.matmul_tflops, "TFLOP/s")),
        (
            "loop overhead",
            "—" if c.loop_overhead_ms is None else f"{c.loop_overhead_ms:.3f} ms per plain token",
        ),
        (
            "step overhead",
            "—" if c.step_overhead_ms is None else f"{c.step_overhead_ms:.3f} ms per speculative step",
        ),
    ]
    tables = [_kv_table("Hardware costs", summary)]
    if c.verify_ms:
        curve = Table(
            title=f"Verification cost C_ver(γ) (worst spread ±{c.verify_spread * 100:.1f}%)",
            title_justify="left",
        )
        curve.add_column("γ", style="bold")
        for g in range(1, len(c.verify_ms) + 1):
            curve.add_column(str(g), justify="right")
        curve.add_row("ms", *(f"{v:.2f}" for v in c.verify_ms))
        curve.add_row("÷ T_target", *(f"{v / c.t_target_ms:.2f}" for v in c.verify_ms))
        tables.append(curve)
    if c.drafts:
        drafts = Table(title="Drafters (cost and acceptance per position)", title_justify="left")
        for name, justify in [
            ("draft", "left"),
            ("T_draft ms", "right"),
            ("c", "right"),
            ("α", "right"),
            ("acceptance by position", "left"),
            ("predicted best", "right"),
        ]:
            drafts.add_column(name, justify=justify)  # type: ignore[arg-type]
        for d in c.drafts:
            curve_points = _predicted_curve(c, d)
            if curve_points:
                g, s = max(curve_points, key=lambda gs: gs[1])
                best = f"γ={g}: {s:.2f}×"
            else:
                best = "—"
            drafts.add_row(
                d.name,
                f"{d.t_draft_ms:.3f}",
                f"{d.c:.3f}",
                f"{d.acceptance_rate:.3f}",
                _vec(d.acceptance_vector),
                best,
            )
        tables.append(drafts)
    return tables


def _unit(v: float | None, unit: str, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f} {unit}"


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        else:
            rows.append((f"{prefix}{k}", str(v)))
    return rows


# -------------------------------------------------------------------------------------- compare

# keys of specdec_tune.hardware's fingerprint first, then common spellings
_DEVICE_KEYS = ("gpu_name", "cpu_model", "name", "device_name", "gpu", "cpu", "device")


def _device(p: Profile) -> str:
    for key in _DEVICE_KEYS:
        if p.hardware.get(key):
            return str(p.hardware[key])
    return "—"


def render_compare(a: Profile, b: Profile, console: Console) -> None:
    """Print two profiles side by side (hardware, best config, speedup, tokens/s, α) and mark the better."""
    t = Table(title="Profile comparison", title_justify="left")
    t.add_column("", style="bold")
    t.add_column(f"A: {a.hardware.get('slug')}")
    t.add_column(f"B: {b.hardware.get('slug')}")
    t.add_column("better", justify="center")

    def same(label: str, va: str, vb: str) -> None:
        t.add_row(label, va, vb, "" if va == vb else "[dim]differs[/]")

    def higher(
        label: str, get: Callable[[Profile], float | None], fmt: Callable[[float | None], str]
    ) -> None:
        va, vb = get(a), get(b)
        if va is None or vb is None or math.isclose(va, vb, rel_tol=0.005, abs_tol=1e-9):
            t.add_row(label, fmt(va), fmt(vb), "≈" if va is not None and vb is not None else "")
        elif va > vb:
            t.add_row(label, f"[bold green]{fmt(va)}[/]", fmt(vb), "[green]A[/]")
        else:
            t.add_row(label, fmt(va), f"[bold green]{fmt(vb)}[/]", "[green]B[/]")

    same("hardware", str(a.hardware.get("slug")), str(b.hardware.get("slug")))
    same("device", _device(a), _device(b))
    same("target", a.target.name, b.target.name)
    same(
        "workload",
        f"{a.workload.name} (T={a.workload.temperature:g})",
        f"{b.workload.name} (T={b.workload.temperature:g})",
    )
    same("best config", a.best.config.label, b.best.config.label)
    higher("speedup", lambda p: p.best.metrics.speedup, _x)
    higher("tokens/s", lambda p: p.best.metrics.tokens_per_s, lambda v: _f(v, 1))
    higher("baseline tokens/s", lambda p: p.baseline.tokens_per_s, lambda v: _f(v, 1))
    higher("acceptance α", lambda p: p.best.metrics.acceptance_rate, lambda v: _f(v, 3))
    higher("mean accepted length τ", lambda p: p.best.metrics.mean_accepted_len, _f)
    higher("predicted speedup", lambda p: p.best.metrics.predicted_speedup, _x)
    console.print(t)
    if a.target.content_hash != b.target.content_hash:
        console.print("[yellow]The profiles tune different target weights: tokens/s are not comparable.[/]")
    if a.workload.sha256 != b.workload.sha256 or a.workload.temperature != b.workload.temperature:
        console.print(
            "[yellow]The profiles were measured on different workloads: "
            "α and speedup may differ for that alone.[/]"
        )


# ---------------------------------------------------------------------------------------- plots

PLOT_FILES = {
    "speedup": "speedup_vs_gamma.png",
    "acceptance": "acceptance_per_position.png",
    "costs": "cost_curve.png",
    "predicted": "predicted_vs_measured.png",
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

    trials = _read_trials(trials_csv) if trials_csv is not None else []
    out_dir = Path(out_dir)
    written = []
    for key, draw in [
        ("speedup", lambda ax: _plot_speedup(ax, profile, trials)),
        ("acceptance", lambda ax: _plot_acceptance(ax, profile)),
        ("costs", lambda ax: _plot_costs(ax, profile)),
        ("predicted", lambda ax: _plot_predicted(ax, profile)),
    ]:
        # a Figure on its own Agg canvas: no pyplot, no global backend switch, nothing left open
        fig = Figure(figsize=(7, 4.5), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if not draw(ax):
            continue
        ax.grid(True, alpha=0.3)
        fig.suptitle(f"{profile.target.name} on {profile.hardware.get('slug')}", fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        path = out_dir / PLOT_FILES[key]
        atomic_write_bytes(path, buf.getvalue())
        written.append(path)
    return written


def _read_trials(path: Path) -> list[dict[str, Any]]:
    """Finished trials from the tuner's CSV: draft, gamma, threshold, speedup (state COMPLETE only)."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            columns = set(reader.fieldnames or [])
            missing = {"draft", "gamma", "speedup"} - columns
            if missing:
                raise SpecDecError(
                    f"trials CSV {path} lacks column(s) {', '.join(sorted(missing))} "
                    "(needs draft, gamma, threshold, speedup, state)"
                )
            rows = []
            for row in reader:
                # Optuna writes "COMPLETE"; str(TrialState.COMPLETE) would be "TrialState.COMPLETE"
                state = (row["state"] or "") if "state" in columns else "COMPLETE"
                if state.rsplit(".", 1)[-1] != "COMPLETE":
                    continue
                try:
                    speedup = float(row["speedup"])
                    gamma = int(float(row["gamma"]))
                except (TypeError, ValueError):
                    continue  # failed or pruned trials carry no speedup
                if math.isfinite(speedup):
                    rows.append({"draft": row["draft"], "gamma": gamma, "speedup": speedup})
            return rows
    except FileNotFoundError:
        raise SpecDecError(f"trials CSV not found: {path}") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SpecDecError(f"cannot read trials CSV {path}: {e}") from None


def _colors(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(dict.fromkeys(names))}


def _plot_speedup(ax: Any, p: Profile, trials: list[dict[str, Any]]) -> bool:
    results = [r for r in [p.best, *p.alternatives] if r.config.gamma > 0]
    drafts = p.costs.drafts if p.costs else []
    names = [d.name for d in drafts] + [t["draft"] for t in trials] + [r.config.draft.name for r in results]
    if not drafts and not trials and len(results) < 2:
        return False
    color = _colors(names)
    for d in drafts:
        curve = _predicted_curve(p.costs, d)  # type: ignore[arg-type]
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
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("Speedup vs γ per draft (◆ alternatives)")
    ax.legend(fontsize=7)
    return True


def _plot_acceptance(ax: Any, p: Profile) -> bool:
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
        return False
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("acceptance at position i")
    ax.set_title("Per-position acceptance")
    ax.legend(fontsize=7)
    return True


def _plot_costs(ax: Any, p: Profile) -> bool:
    c = p.costs
    if c is None or not c.verify_ms:
        return False
    gammas = list(range(1, len(c.verify_ms) + 1))
    ax.plot(gammas, c.verify_ms, "o-", color="black", label="C_ver(γ): verify γ drafts")
    ax.axhline(c.t_target_ms, color="grey", linestyle=":", label=f"T_target = {c.t_target_ms:.2f} ms")
    color = _colors([d.name for d in c.drafts])
    for d in c.drafts:
        ax.plot(
            gammas, [g * d.t_draft_ms for g in gammas], "--", color=color[d.name], label=f"γ·T_draft {d.name}"
        )
    ax.set_xlabel("γ")
    ax.set_ylabel("ms per step")
    ax.set_title("Cost curve: verification vs drafting")
    ax.legend(fontsize=7)
    return True


def _plot_predicted(ax: Any, p: Profile) -> bool:
    points = [
        (r.metrics.predicted_speedup, r.metrics.speedup, r.config.label, r is p.best)
        for r in [p.best, *p.alternatives]
        if r.metrics.predicted_speedup is not None
    ]
    if not points:
        return False
    for pred, meas, label, is_best in points:
        ax.scatter(pred, meas, marker="*" if is_best else "o", s=160 if is_best else 40, zorder=3)
        ax.annotate(label, (pred, meas), textcoords="offset points", xytext=(5, 4), fontsize=7)
    values = [v for pred, meas, _, _ in points for v in (pred, meas)]
    # keep speedup 1 in view: which side of it a point lies on is the whole story
    low, high = min(*values, 1.0) * 0.95, max(*values, 1.0) * 1.05
    ax.plot([low, high], [low, high], color="grey", linestyle=":", label="y = x (perfect prediction)")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("predicted speedup (cost model)")
    ax.set_ylabel("measured speedup")
    ax.set_title("Cost model: predicted vs measured")
    ax.legend(fontsize=7)
    return True


def bench_table(r: dict[str, Any]) -> Table:
    """The `specdec-tune bench` result: one config against the baseline (and HF's, if timed)."""
    t = Table(
        title=f"bench: {r['draft']} γ={r['gamma']} t={r['threshold']:.2f} on {r['workload']} "
        f"({r['prompts']} prompts, T={r['temperature']}, {r['device']})",
        show_header=True,
    )
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("speedup vs plain target", f"{r['speedup']:.3f}× (spread {r['speedup_spread'] * 100:.1f}%)")
    t.add_row("tokens/s speculative", f"{r['tokens_per_s']:.1f}")
    t.add_row("tokens/s plain target", f"{r['baseline_tokens_per_s']:.1f}")
    t.add_row("acceptance rate α", f"{r['acceptance_rate']:.3f}")
    t.add_row("mean accepted length τ", f"{r['mean_accepted_len']:.2f} tokens / target forward")
    t.add_row("per-position acceptance", _vec(r["per_position_acceptance"]))
    t.add_row("repeats (median reported)", str(r["repeats"]))
    if r["temperature"] == 0:
        exact = "yes" if r["mismatches"] == 0 else f"NO: {r['mismatches']} prompts differ"
        t.add_row("greedy output identical to target", exact)
    hf = r.get("hf")
    if hf:
        t.add_row("tokens/s HF assisted generation", f"{hf['hf_tokens_per_s']:.1f}")
        t.add_row("ours / HF", f"{hf['ratio']:.3f}× (spread {hf['ratio_spread'] * 100:.1f}%)")
        t.add_row("identical tokens to HF", "yes" if hf["identical_tokens"] else "no")
    return t


def costs_report(
    console: Console,
    hardware: dict[str, Any],
    costs: Costs,
    per_draft: dict[str, tuple[int, float]],
    ranked: list[tuple[str, int, float]],
) -> None:
    """The `specdec-tune profile` output: hardware, bandwidth, cost curve, drafts, predictions."""
    console.print(_kv_table("hardware", [(k, str(v)) for k, v in hardware.items()]))
    console.print(
        _kv_table(
            "bandwidth and throughput",
            [
                ("copy bandwidth", _unit(costs.copy_bandwidth_gbps, "GB/s")),
                ("target decode bandwidth (weights × tok/s)", _unit(costs.decode_bandwidth_gbps, "GB/s")),
                ("roofline share (decode / copy)", _f(costs.roofline_share)),
                ("matmul throughput", _unit(costs.matmul_tflops, "TFLOP/s")),
                ("plain-loop overhead o_loop", _unit(costs.loop_overhead_ms, "ms per token", 3)),
                ("speculative-step overhead o_step", _unit(costs.step_overhead_ms, "ms per step", 3)),
            ],
        )
    )
    curve = Table(title=f"target costs at context {costs.context_len} (median, relative spread)")
    curve.add_column("γ", justify="right")
    curve.add_column("C_ver(γ) ms", justify="right")
    curve.add_column("C_ver / T_target", justify="right")
    curve.add_row("0 (T_target)", f"{costs.t_target_ms:.3f} ± {costs.t_target_spread * 100:.1f}%", "1.00")
    for g, v in enumerate(costs.verify_ms, start=1):
        curve.add_row(str(g), f"{v:.3f}", f"{v / costs.t_target_ms:.2f}")
    curve.caption = f"worst C_ver spread {costs.verify_spread * 100:.1f}%"
    console.print(curve)
    drafts = Table(title="drafts")
    for col in (
        "draft",
        "T_draft ms/token",
        "c",
        "α (greedy)",
        "acceptance by position",
        "best γ",
        "predicted",
    ):
        drafts.add_column(col, justify="left" if col in ("draft", "acceptance by position") else "right")
    for d in costs.drafts:
        g, v = per_draft.get(d.name, (0, 1.0))
        drafts.add_row(
            d.name,
            f"{d.t_draft_ms:.3f}",
            f"{d.c:.3f}",
            f"{d.acceptance_rate:.3f}",
            _vec(d.acceptance_vector[:8]) + (" …" if len(d.acceptance_vector) > 8 else ""),
            str(g) if g else "don't",
            f"{v:.2f}×",
        )
    console.print(drafts)
    if ranked:
        top = Table(title="predicted best configs (cost model, threshold 0)")
        top.add_column("draft")
        top.add_column("γ", justify="right")
        top.add_column("predicted speedup", justify="right")
        for name, g, v in ranked:
            top.add_row(name, str(g), f"{v:.3f}×")
        console.print(top)


def run_summary(console: Console, p: Profile, result: Any) -> None:
    """The end of `specdec-tune run`: best, runner-up, baseline, predicted vs measured."""
    t = Table(
        title=f"{p.target.name} on {p.hardware.get('slug')}: {p.workload.name}, T={p.workload.temperature}"
    )
    # Nine columns fit an 80-column terminal without borders and with short headers.
    t.box, t.padding, t.pad_edge = box.SIMPLE_HEAD, (0, 0), False
    for col in ("", "config", "speedup", "spread", "search", "tok/s", "α", "τ", "pred."):
        t.add_column(col, justify="left" if col in ("", "config") else "right", no_wrap=True)
    rows = [("best", p.best), *(("runner-up", r) for r in p.alternatives[:1])]
    for label, r in rows:
        m = r.metrics
        t.add_row(
            label,
            r.config.label,
            f"{m.speedup:.3f}×",
            f"{m.speedup_spread * 100:.0f}%",
            _x(m.search_speedup),
            f"{m.tokens_per_s:.1f}",
            f"{m.acceptance_rate:.2f}",
            f"{m.mean_accepted_len:.2f}",
            _x(m.predicted_speedup),
        )
    t.add_row(
        "baseline", "plain target", "1.000×", "", "", f"{p.baseline.tokens_per_s:.1f}", "—", "1.00", "1.00×"
    )
    final = (
        f"; speedup: the top {p.search.finalists} re-measured head to head ({p.search.final_repeats} "
        "repeats), search: their search trial"
        if p.search.finalists
        else ""
    )
    t.caption = (
        f"{p.search.trials} trials ({p.search.pruned} pruned, {p.search.failed} failed){final}; "
        f"pred.: the cost model; study {p.search.study_name}"
    )
    console.print(t)
    if getattr(result, "final_note", ""):
        console.print(f"[yellow]{result.final_note}[/] (the best search trial was kept)")
    if p.best.config.gamma == 0:
        console.print(
            "[bold]verdict:[/bold] speculation does not pay here for this workload; serve the plain target."
        )
