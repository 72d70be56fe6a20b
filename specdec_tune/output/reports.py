"""The reports of the measuring commands as rich tables: a bench result, the costs profile, the
end of a run, a check report. Reads data, never measures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..domain import Costs
from ..store.schema import Profile
from .fmt import compile_words, final_verdict, kv_table, num, styled, times, unit, vec
from .tables import batch_table
from .verdicts import CheckReport

if TYPE_CHECKING:
    from ..app.check_plan import CheckPlan
    from ..search.results import TuneResult


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
    plain = "plain batched decoding" if "batch_size" in r else "plain target"
    t.add_row(f"tokens/s {plain}", f"{r['baseline_tokens_per_s']:.1f}")
    t.add_row("acceptance rate α", f"{r['acceptance_rate']:.3f}")
    t.add_row("mean accepted length τ", f"{r['mean_accepted_len']:.2f} tokens / target forward")
    t.add_row("per-position acceptance", vec(r["per_position_acceptance"]))
    t.add_row("repeats (median reported)", str(r["repeats"]))
    built = r.get("compile") or {}
    if built.get("graphs") or built.get("graphs_in_timing"):
        t.add_row(
            "compile (before timing, not timed)",
            f"{built['graphs']} graphs, {built['compile_s']:.1f} s"
            + (
                f"; {built['graphs_in_timing']} built inside timing, re-timed"
                if built["graphs_in_timing"]
                else ""
            ),
        )
    if "batch_size" in r:
        spec, plain = r["speculative"], r["plain"]
        t.add_row("batch size (requests in flight)", str(r["batch_size"]))
        t.add_row(
            "request latency p50 / p90",
            f"{spec['latency_ms_p50']:.0f} / {spec['latency_ms_p90']:.0f} ms "
            f"(plain {plain['latency_ms_p50']:.0f} / {plain['latency_ms_p90']:.0f} ms)",
        )
        if spec["peak_memory_mb"] is not None and plain["peak_memory_mb"] is not None:
            t.add_row(
                "peak memory", f"{spec['peak_memory_mb']:.0f} MB (plain {plain['peak_memory_mb']:.0f} MB)"
            )
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
    target: dict[str, Any] | None = None,
) -> None:
    """The `specdec-tune profile` output: hardware, target, bandwidth, cost curve, drafts,
    predictions; random weights (a shape) and unknown acceptance are said where they apply."""
    console.print(kv_table("hardware", [(k, str(v)) for k, v in hardware.items()]))
    if target:
        console.print(target_table(target, costs))
    console.print(
        kv_table(
            "bandwidth and throughput",
            [
                ("engine mode", costs.engine_mode + _fallbacks(costs.compile_fallbacks)),
                *([("compile (not timed)", compile_words(costs.compile))] if costs.compile else []),
                ("copy bandwidth", unit(costs.copy_bandwidth_gbps, "GB/s")),
                ("target decode bandwidth (weights × tok/s)", unit(costs.decode_bandwidth_gbps, "GB/s")),
                ("roofline share (decode / copy)", num(costs.roofline_share)),
                ("matmul throughput", unit(costs.matmul_tflops, "TFLOP/s")),
                ("plain-loop overhead o_loop", unit(costs.loop_overhead_ms, "ms per token", 3)),
                ("speculative-step overhead o_step", unit(costs.step_overhead_ms, "ms per step", 3)),
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
    console.print(drafts_table(costs, per_draft))
    unknown = [d.name for d in costs.drafts if not d.acceptance_known]
    if unknown:
        console.print(
            styled(
                ("acceptance unknown", "yellow"),
                f" for {', '.join(unknown)}: not measurable against random "
                "weights, so no speedup is predicted; give it with --acceptance-vector [DRAFT=]A1,A2,... "
                "or --acceptance-from FILE",
            ),
            soft_wrap=True,
        )
    if ranked:
        top = Table(title="predicted best configs (cost model, threshold 0)")
        top.add_column("draft")
        top.add_column("γ", justify="right")
        top.add_column("predicted speedup", justify="right")
        for name, g, v in ranked:
            top.add_row(name, str(g), f"{v:.3f}×")
        console.print(top)


def target_table(target: dict[str, Any], costs: Costs) -> Table:
    """The profiled target: name, size, dtype, and whether its weights are random (a shape)."""
    weights: str | Text = "trained"
    if costs.weights == "random":
        weights = styled(
            ("random", "yellow"), f" (shape {costs.shape}): real timings for this size, no acceptance"
        )
    rows = [("model", str(target.get("name"))), ("dtype", str(target.get("dtype")))]
    n = target.get("num_params") or 0
    if n:
        rows.append(("parameters", f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"))
    return kv_table("target", [*rows, ("weights", weights)])


def drafts_table(costs: Costs, per_draft: dict[str, tuple[int, float]]) -> Table:
    """Each draft's cost, acceptance (and where it came from) and best predicted γ."""
    t = Table(title="drafts")
    for col in (
        "draft",
        "T_draft ms/token",
        "c",
        "α",
        "acceptance by position",
        "from",
        "best γ",
        "predicted",
    ):
        t.add_column(col, justify="left" if col in ("draft", "acceptance by position", "from") else "right")
    for d in costs.drafts:
        if not d.acceptance_known:
            t.add_row(d.name, f"{d.t_draft_ms:.3f}", f"{d.c:.3f}", "unknown", "—", "unknown", "—", "—")
            continue
        g, v = per_draft.get(d.name, (0, 1.0))
        t.add_row(
            d.name,
            f"{d.t_draft_ms:.3f}",
            f"{d.c:.3f}",
            f"{d.acceptance_rate:.3f}",
            vec(d.acceptance_vector[:8]) + (" …" if len(d.acceptance_vector) > 8 else ""),
            d.acceptance_source.removeprefix("from:"),
            str(g) if g else "don't",
            f"{v:.2f}×",
        )
    return t


def run_summary(console: Console, p: Profile, result: TuneResult) -> None:
    """The end of `specdec-tune run`: best, runner-up, baseline, predicted vs measured."""
    t = Table(
        title=f"{p.target.name} on {p.hardware.get('slug')}: {p.workload.name}, T={p.workload.temperature}"
    )
    # Nine columns fit an 80-column terminal without borders and with short headers. Where they do
    # not (a long config name), the config column folds and the numbers stay whole.
    t.box, t.padding, t.pad_edge = box.SIMPLE_HEAD, (0, 0), False
    for col in ("", "config", "speedup", "95% CI", "trial", "tok/s", "α", "τ", "pred."):
        if col == "config":
            t.add_column(col, overflow="fold")
        else:
            t.add_column(col, justify="left" if col == "" else "right", no_wrap=True)
    rows = [("best", p.best), *(("runner-up", r) for r in p.alternatives[:1])]
    for i, (label, r) in enumerate(rows):
        m = r.metrics
        # Only final-round numbers share a column: a search trial's goes to its own column alone.
        # The final round's configs lead the ranking (search.final); an engine default raced there
        # has no trial (no search_speedup) and is a final-round number all the same.
        searched_only = p.search.finalists > 0 and i >= p.search.finalists
        t.add_row(
            label,
            r.config.label,
            "—" if searched_only else f"{m.speedup:.3f}×",
            "" if searched_only or not m.speedup_interval else "{:.2f}–{:.2f}".format(*m.speedup_interval),
            times(m.speedup if searched_only else m.search_speedup)
            if searched_only or m.search_speedup
            else "",
            f"{m.tokens_per_s:.1f}",
            f"{m.acceptance_rate:.2f}",
            f"{m.mean_accepted_len:.2f}",
            times(m.predicted_speedup),
        )
    t.add_row(
        "baseline", "plain target", "1.000×", "", "", f"{p.baseline.tokens_per_s:.1f}", "—", "1.00", "1.00×"
    )
    final = (
        f"; speedup: the top {p.search.finalists} re-measured head to head (up to {p.search.final_repeats} "
        "repeats), trial: a search trial's number, not comparable with them"
        if p.search.finalists
        else ""
    )
    t.caption = (
        f"{p.search.trials} trials ({p.search.pruned} pruned, {p.search.failed} failed){final}; "
        f"pred.: the cost model; study {p.search.study_name}"
    )
    console.print(t)
    if p.search.final_verdict:
        style = "green" if p.search.final_verdict == "resolved" else "yellow"
        console.print(styled((f"final round {final_verdict(p.search)}", style)))
    if p.search.outliers:
        console.print(styled((f"outlier search trials, not believed: {', '.join(p.search.outliers)}", "dim")))
    if p.search.budget_note:
        console.print(styled((f"time budget {p.search.budget_s:g} s: {p.search.budget_note}", "dim")))
    if p.batch_table:
        console.print(batch_table(p))
    if getattr(result, "final_note", ""):
        console.print(styled((result.final_note, "yellow"), " (the best search trial was kept)"))
    if p.best.config.gamma == 0:
        console.print(
            styled(
                ("verdict:", "bold"),
                " speculation does not pay here for this workload; serve the plain target.",
            )
        )


def check_table(report: CheckReport) -> Table:
    """A `check` report (output.check.CheckReport): one row per compared metric."""
    t = Table(title=f"check {report.profile}: {report.config}")
    for col in ("metric", "stored", "measured", "result", "note"):
        t.add_column(col)
    for i in report.items:
        verdict = styled(("ok", "green")) if i.ok else styled(("REGRESSION", "red"))
        t.add_row(i.metric, str(i.stored), str(i.measured), verdict, i.note)
    return t


def _fallbacks(lines: list[str]) -> str:
    return f" (compile failed, ran static: {'; '.join(lines)})" if lines else ""


def check_plan_text(plan: CheckPlan) -> str:
    """`check --dry-run` (app.check_plan.CheckPlan) as a few plain lines."""
    lines = [
        f"{plan.profile}: valid; `check` would re-measure in {plan.backend} (measured on {plan.measured_on}, "
        f"this machine is {plan.here})",
        f"  target: {plan.target}",
        *(
            f"  draft {name}: {where or 'no file (drafts from the context)'}"
            for name, where in plan.drafts.items()
        ),
        f"  workload: {plan.workload} (unchanged)",
        *(f"  re-measure: {item}" for item in plan.items),
        *(f"  note: {n}" for n in plan.notes),
    ]
    return "\n".join(lines)
