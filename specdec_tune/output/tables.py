"""Show results to a person as rich tables: a profile (`show`; two side by side in `compare`,
its trials in `trials`), the costs profile, a bench result, the end of a run, a check report.
Reads data, never measures.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..domain import Costs, Metrics, Result
from ..search.costmodel import CostModel
from ..store.schema import Profile
from ..urls import redact_url
from .engine import engine_rows
from .envelope import cell_label, confirmed_words, envelope_table
from .fmt import (
    add_columns,
    compile_words,
    final_verdict,
    interval,
    kv_table,
    noise_words,
    num,
    plain,
    styled,
    times,
    unit,
    vec,
)
from .schedule import schedule_table

# ------------------------------------------------------------------------------------- numbers


# --------------------------------------------------------------------------------------- tables


def render_profile(profile: Profile, console: Console) -> None:
    """Print the profile as tables: best, alternatives, baseline, run, hardware, costs."""
    p = profile
    console.print(
        Text.assemble(
            ("specdec-tune profile ", "bold"),
            (plain(p.target.name), "bold cyan"),
            " on ",
            (plain(p.hardware.get("slug")), "bold magenta"),
            (f"  (created {p.created or '?'}, schema {p.schema_version})", "dim"),
        )
    )
    console.print(_best_table(p))
    if p.alternatives:
        console.print(_results_table("Alternatives (next best)", p.alternatives))
        if any(a.metrics.search_speedup is None for a in p.alternatives) and p.search.finalists:
            console.print(
                styled(
                    (
                        "final: re-measured head to head with the best in the final round; (in brackets): a "
                        "search trial's number, not comparable with the final round's (it runs high when it was "
                        "the largest of many noisy trials).",
                        "dim",
                    )
                )
            )
    console.print(_baseline_table(p.baseline))
    if p.batch_table:
        console.print(batch_table(p))
    schedule = schedule_table(p.backend.schedule)
    if schedule is not None:
        console.print(schedule)
    envelope = envelope_table(p)
    if envelope is not None:
        console.print(envelope)
    console.print(_run_table(p))
    console.print(kv_table("Hardware", _flatten(p.hardware)))
    if p.costs is None:
        console.print(styled(("No hardware costs in this profile (run without the profiler).", "dim")))
    else:
        for table in _costs_tables(p.costs):
            console.print(table)


def batch_table(p: Profile) -> Table:
    """The best config per batch size (closed loop, B requests in flight), B* and the surface's story."""
    t = Table(title="Batch sizes (speedup over plain batched decoding at the same B)", title_justify="left")
    add_columns(
        t,
        [
            ("B", "right"),
            ("best config", "left"),
            ("speedup", "right"),
            ("tok/s", "right"),
            ("plain tok/s", "right"),
            ("predicted", "right"),
            ("each draft at its best γ", "left"),
        ],
    )
    for row in p.batch_table:
        m = row.best.metrics
        drafts = ", ".join(
            f"{r.config.draft.name} γ{r.config.gamma} {times(r.metrics.speedup)}" for r in row.per_draft
        )
        t.add_row(
            str(row.batch_size),
            cell_label(row),
            times(m.speedup),
            f"{m.tokens_per_s:.0f}",
            f"{m.baseline_tokens_per_s:.0f}",
            times(row.predicted_speedup),
            drafts or "—",
        )
    b_star = f"B* = {p.b_star}" if p.b_star else "B*: speculation won at every measured batch size"
    predicted = f"; the cost model predicts B* = {p.predicted_b_star}" if p.predicted_b_star else ""
    bound = ""
    if p.costs is not None and p.costs.memory_bound_until:
        bound = f"; verification is about free (memory-bound) up to B = {p.costs.memory_bound_until}"
    t.caption = f"{b_star}{predicted}{bound}" + confirmed_words(p.batch_table)
    return t


def _best_table(p: Profile) -> Table:
    best = p.best
    m = best.metrics
    cfg = best.config
    t = Table(title="Best config", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    if cfg.draft.kind == "none":
        t.add_row("config", styled(("no speculation: plain decoding was fastest here", "yellow")))
    else:
        t.add_row("config", styled((cfg.label, "bold green")))
        drafter = cfg.draft.label + (f"  {cfg.draft.path}" if cfg.draft.path else "")
        t.add_row("drafter", f"{cfg.draft.kind}: {drafter}")
    where = "final round" if m.search_speedup is not None else "search trial"
    t.add_row(
        "speedup",
        # the interval, where there is one: one wild repeat blows up max − min, not a median's interval
        styled(
            (times(m.speedup), "bold"),
            f" ({where}: {m.repeats} repeats, median; "
            + (
                f"95% interval {interval(m.speedup_interval, 3)})"
                if m.speedup_interval
                else f"spread {m.speedup_spread * 100:.1f}% max−min)"
            ),
        ),
    )
    if m.search_speedup is not None:
        t.add_row(
            "search trial", f"{times(m.search_speedup)} (one trial, not comparable; the final round decides)"
        )
    t.add_row("tokens/s", f"{m.tokens_per_s:.1f} (baseline {m.baseline_tokens_per_s:.1f} in the same run)")
    t.add_row("acceptance α", num(m.acceptance_rate, 3))
    t.add_row("mean accepted length τ", num(m.mean_accepted_len))
    t.add_row("per-position acceptance", vec(m.per_position_acceptance))
    t.add_row("predicted speedup", times(m.predicted_speedup))
    return t


def _results_table(title: str, results: list[Result]) -> Table:
    t = Table(title=title, title_justify="left")
    add_columns(
        t,
        [
            ("#", "right"),
            ("config", "left"),
            ("speedup", "right"),
            ("interval", "right"),
            ("tokens/s", "right"),
            ("α", "right"),
            ("τ", "right"),
            ("predicted", "right"),
            ("measured in", "left"),
        ],
    )
    for i, r in enumerate(results, 1):
        m = r.metrics
        # a search trial's number is bracketed: it is not comparable with the final round's
        t.add_row(
            str(i),
            r.config.label,
            times(m.speedup) if m.search_speedup is not None else f"({times(m.speedup)})",
            interval(m.speedup_interval),
            f"{m.tokens_per_s:.1f}",
            num(m.acceptance_rate, 3),
            num(m.mean_accepted_len),
            times(m.predicted_speedup),
            _measured_in(m),
        )
    return t


def _measured_in(m: Metrics) -> str:
    if m.search_speedup is None:
        return "search trial only"
    return f"final (search trial {times(m.search_speedup)})"


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
            f"top {s.finalists} re-measured head to head, up to {s.final_repeats} interleaved repeats"
            + (f"; {final_verdict(s)}" if s.final_verdict else "")
            if s.finalists
            else "none (ranked by the search trials)",
        ),
        *(
            [("outlier trials", ", ".join(s.outliers) + " (not believed; re-measured or left out)")]
            if s.outliers
            else []
        ),
        ("study", f"{s.study_name} in {redact_url(s.storage)}"),  # a hand-written profile may hold a password
        (
            "engine mode",
            p.engine_mode
            + (f" (compile failed: {'; '.join(p.compile_fallbacks)})" if p.compile_fallbacks else ""),
        ),
        ("versions", ", ".join(f"{k} {v}" for k, v in p.versions.items()) or "—"),
        *engine_rows(p),
    ]
    if p.compile is not None:
        rows.append(("compile", compile_words(p.compile)))
    if p.noise is not None:
        rows.append(("machine noise", noise_words(p.noise)))
    if p.anchors is not None:
        a = p.anchors
        rows.append(
            (
                "anchors",
                f"plain {a.plain_tokens_per_s:.1f} tokens/s, copy {unit(a.copy_bandwidth_gbps, 'GB/s')}, "
                f"matmul {unit(a.matmul_gflops, 'GFLOP/s')}",
            )
        )
        if a.has_reference:
            plain = ", ".join(f"{x:.1f}" for x in a.reference_baseline_tokens_per_s)
            spec = ", ".join(f"{x:.1f}" for x in a.reference_tokens_per_s)
            speedups = ", ".join(f"{x:.3f}×" for x in a.reference_speedups)
            rows.append(
                (
                    "check's reference",
                    f"plain {plain} tokens/s, best {spec} tokens/s"
                    + (f" ({speedups})" if speedups else "")
                    + " "
                    f"({len(a.reference_baseline_tokens_per_s)} fresh processes, measured as check measures"
                    + (
                        f", on the check slice: {a.reference_threads} thread on a free core"
                        if a.sliced
                        else ""
                    )
                    + ")",
                )
            )
        if a.has_anchor_reference:
            ratios = ", ".join(f"{x:.4f}" for x in a.reference_plain_per_anchor)
            n = sum(m[2] for m in a.decode_anchor.matrices)
            rows.append(
                (
                    "decode anchor",
                    f"plain tokens/s per anchor step/s {ratios} ({n} matrices of the target's "
                    f"{len(a.decode_anchor.matrices)} shapes, {a.decode_anchor.dtype}; check judges "
                    "plain decoding by this ratio)",
                )
            )
    return kv_table("Run", rows)


def _costs_tables(c: Costs) -> list[Table]:
    summary = [
        ("T_target", f"{c.t_target_ms:.3f} ms per token (spread ±{c.t_target_spread * 100:.1f}%)"),
        ("context length", str(c.context_len)),
        ("engine mode", c.engine_mode),
        ("copy bandwidth", unit(c.copy_bandwidth_gbps, "GB/s")),
        ("decode bandwidth", unit(c.decode_bandwidth_gbps, "GB/s")),
        ("roofline share", "—" if c.roofline_share is None else f"{c.roofline_share * 100:.0f}%"),
        ("matmul", unit(c.matmul_tflops, "TFLOP/s")),
        (
            "loop overhead",
            "—" if c.loop_overhead_ms is None else f"{c.loop_overhead_ms:.3f} ms per plain token",
        ),
        (
            "step overhead",
            "—" if c.step_overhead_ms is None else f"{c.step_overhead_ms:.3f} ms per speculative step",
        ),
    ]
    if c.weights == "random":
        summary.append(("target weights", f"random (shape {c.shape}): timings only, no measured acceptance"))
    tables = [kv_table("Hardware costs", summary)]
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
    if c.batch:
        surface = Table(
            title="Cost surface C_ver(B, γ) / T_target(B) (T_target(B) in ms)", title_justify="left"
        )
        surface.add_column("B", justify="right", style="bold")
        surface.add_column("T_target ms", justify="right")
        for g in range(1, len(c.batch[0].verify_ms) + 1):
            surface.add_column(f"γ{g}", justify="right")
        surface.add_column("T_draft ms", justify="left")
        for b in c.batch:
            drafts = ", ".join(f"{k} {v:.2f}" for k, v in b.t_draft_ms.items())
            ratios = [f"{v / b.t_target_ms:.2f}" for v in b.verify_ms]
            surface.add_row(str(b.batch_size), f"{b.t_target_ms:.2f}", *ratios, drafts)
        tables.append(surface)
    if c.drafts:
        drafts = Table(title="Drafters (cost and acceptance per position)", title_justify="left")
        add_columns(
            drafts,
            [
                ("draft", "left"),
                ("T_draft ms", "right"),
                ("c", "right"),
                ("α", "right"),
                ("acceptance by position", "left"),
                ("predicted best", "right"),
            ],
        )
        for d in c.drafts:
            curve_points = CostModel(c).curve(d.name)
            if curve_points:
                g, s = max(curve_points, key=lambda gs: gs[1])
                best = f"γ={g}: {s:.2f}×"
            else:
                best = "—"
            known = d.acceptance_known
            drafts.add_row(
                d.name,
                f"{d.t_draft_ms:.3f}",
                f"{d.c:.3f}",
                f"{d.acceptance_rate:.3f}" if known else "unknown",
                vec(d.acceptance_vector)
                + ("" if d.acceptance_source == "measured" else f" ({d.acceptance_source})"),
                best,
            )
        tables.append(drafts)
    return tables


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows += _flatten(v, f"{prefix}{k}.")
        else:
            rows.append((f"{prefix}{k}", str(v)))
    return rows
