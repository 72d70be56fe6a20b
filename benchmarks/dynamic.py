"""Does dynamic drafting raise the ceiling? Tuned speedup on the demo pair with the new kinds (the
hybrid drafter, adaptive gamma policies) vs without, timed in ONE interleaved run; the cost model's
ceiling for the pair from the measured costs and acceptance vectors; and per-category answers on
the `general` workload.

1. profile the costs of every drafter (the hybrids included: acceptance vector, T_draft from the
   per-source shares);
2. a short TPE search over the static space (model drafts, prompt lookup, fixed gamma), and one over
   the whole space (+ hybrids, gamma_policy in {fixed, heuristic, costmodel}), each with its final
   round;
3. the two winners (and each search's runner-up) re-measured with the baseline in one interleaved
   run (measure_many);
4. the cost model's prediction for every draft x policy, and what each cost term costs the best;
5. on `general`, every category: the candidates measured on each category's prompts, the
   per-category best vs the single overall best.

    python benchmarks/dynamic.py [--prompts 8] [--max-new-tokens 48] [--trials 12]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specdec_tune.app.categories import split_by_category
from specdec_tune.app.common import Progress, measure_costs
from specdec_tune.backends.native_pool import DrafterPool
from specdec_tune.domain import Config
from specdec_tune.measure.backends import NativeBackend
from specdec_tune.measure.bench import Entry, measure_many
from specdec_tune.runtime.session import load_models
from specdec_tune.search.costmodel import CostModel, expected_tokens, verify_cost_ms
from specdec_tune.search.space import TuneSettings
from specdec_tune.search.tuner import tune

STATIC = ["draft-1l", "draft-2l", "prompt-lookup"]
DYNAMIC = [
    "hybrid:prompt-lookup+draft-1l",
    "hybrid:prompt-lookup:3-4+draft-1l",
    "hybrid:prompt-lookup+draft-2l",
]
POLICIES = ("fixed", "heuristic", "costmodel")


def row(config: Config, m) -> dict:
    return {
        "config": config.label,
        "speedup": round(m.speedup, 4),
        "spread": round(m.speedup_spread, 4),
        "tokens_per_s": round(m.tokens_per_s, 1),
        "baseline_tokens_per_s": round(m.baseline_tokens_per_s, 1),
        "acceptance_rate": round(m.acceptance_rate, 3),
        "mean_accepted_len": round(m.mean_accepted_len, 3),
        "per_source": m.per_source,
    }


def search(s, pool, specs, costs, settings, label, log):
    t0 = time.monotonic()
    pool.costs = costs
    result = tune(NativeBackend(pool), specs, s.case, settings, costs, {"bench": label})
    log(f"{label}: {result.trials} trials in {time.monotonic() - t0:.0f} s; top:")
    for r in result.results[:5]:
        searched = f" (search {r.metrics.search_speedup:.3f})" if r.metrics.search_speedup else ""
        log(f"   {r.config.label}: {r.metrics.speedup:.3f}{searched}")
    return [r for r in result.results if r.config.gamma > 0]


def ceiling(costs, max_gamma: int, log) -> dict:
    """Predicted best per draft x policy, and for the best: what each term of the cost model costs."""
    model = CostModel(costs)
    preds = {}
    for d in costs.drafts:
        for policy in POLICIES:
            best = max(
                ((g, model.predict(d.name, g, policy=policy) or 0.0) for g in range(1, max_gamma + 1)),
                key=lambda x: x[1],
            )
            preds[f"{d.name} {policy}"] = {"gamma": best[0], "predicted": round(best[1], 3)}
    name, top = max(preds.items(), key=lambda kv: kv[1]["predicted"])
    draft = costs.draft(name.rsplit(" ", 1)[0])
    g = top["gamma"]
    tokens = expected_tokens(draft.acceptance_vector, g)
    t, ver = costs.t_target_ms, verify_cost_ms(costs.verify_ms, g)
    loop, step = costs.loop_overhead_ms or 0.0, costs.step_overhead_ms or 0.0
    drafting = g * draft.t_draft_ms

    def speed(ver_ms=ver, draft_ms=drafting, step_ms=step, tok=tokens) -> float:
        return (t + loop) * tok / (draft_ms + ver_ms + step_ms)

    terms = {
        "E[tokens]": round(tokens, 3),
        "T_target+loop_ms": round(t + loop, 3),
        "C_ver_ms": round(ver, 3),
        "drafting_ms": round(drafting, 3),
        "step_overhead_ms": round(step, 3),
        "predicted": round(speed(), 3),
        "if C_ver = T_target": round(speed(ver_ms=t), 3),
        "if drafting were free": round(speed(draft_ms=0.0), 3),
        "if no step overhead": round(speed(step_ms=0.0), 3),
        "if every draft accepted": round(speed(tok=g + 1), 3),
    }
    log(f"cost-model ceiling: {name} γ≤{g}: {terms}")
    return {"per_draft_policy": preds, "best": name, "gamma": g, "terms": terms}


def per_category(args, configs: list[Config], costs, log) -> dict:
    names = sorted({c.draft.name for c in configs})
    s = load_models(
        None,
        names,
        "general",
        args.category_tokens,
        0.0,
        "cpu",
        "auto",
        args.category_prompts,
        lazy_drafts=False,
        engine_mode=args.engine,
    )
    pool = DrafterPool(s.specs, s.target.model, load=lambda spec: s.drafts[spec.name].model)
    pool.costs = costs  # the demo pair's costs: the costmodel policy's table
    table, totals = [], {i: [0.0, 0.0] for i in range(len(configs))}  # spec time, baseline time
    for cat, case in split_by_category(s.workload, s.case).items():
        entries = [Entry(pool.for_config(c), c.gamma, c.threshold) for c in configs]
        ms = measure_many(s.target.model, entries, case, args.category_repeats)
        for i, m in enumerate(ms):
            totals[i][0] += m.tokens / m.metrics.tokens_per_s
            totals[i][1] += m.tokens / m.metrics.baseline_tokens_per_s
        j = max(range(len(ms)), key=lambda i: ms[i].metrics.speedup)
        j = j if ms[j].metrics.speedup > 1.0 else -1  # -1: plain decoding was fastest here
        table.append(
            {
                "category": cat,
                "prompts": len(case.prompts),
                "speedups": [m.metrics.speedup for m in ms],
                "acceptance": [m.metrics.acceptance_rate for m in ms],
                "best": j,
            }
        )
    overall = [b / a for a, b in totals.values()]
    k = max(range(len(configs)), key=lambda i: overall[i])
    log(
        f"general, per category ({args.category_prompts} prompts x {args.category_tokens} tokens, "
        f"{args.category_repeats} repeats); overall best: {configs[k].label} at {overall[k]:.3f}"
    )
    for r in table:
        best, here = r["best"], r["speedups"]
        label = configs[best].label if best >= 0 else "no speculation"
        best_speedup = here[best] if best >= 0 else 1.0
        alpha = r["acceptance"][best] if best >= 0 else 0.0
        r |= {
            "best_config": label,
            "best_speedup": best_speedup,
            "overall_best_speedup": here[k],
            "gain": best_speedup / here[k] - 1,
        }
        log(
            f"   {r['category']:15s} best {label} {best_speedup:.3f} (α {alpha:.2f})"
            f" | overall best here {here[k]:.3f} | gain {100 * r['gain']:+.1f}%"
        )
    return {
        "configs": [c.label for c in configs],
        "overall": overall,
        "overall_best": configs[k].label,
        "table": table,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-gamma", type=int, default=8)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--check-repeats", type=int, default=6)
    ap.add_argument("--category-prompts", type=int, default=12)
    ap.add_argument("--category-tokens", type=int, default=32)
    ap.add_argument("--category-repeats", type=int, default=2)
    ap.add_argument(
        "--engine", default="eager", help="engine mode (runtime.caches.modes): eager, static, compiled, auto"
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/dynamic.json"))
    args = ap.parse_args()
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    started = time.monotonic()
    s = load_models(
        None,
        STATIC + DYNAMIC,
        "demo-code",
        args.max_new_tokens,
        0.0,
        "cpu",
        "auto",
        args.prompts,
        lazy_drafts=False,
        engine_mode=args.engine,
    )
    pool = DrafterPool(s.specs, s.target.model, load=lambda spec: s.drafts[spec.name].model)
    costs = measure_costs(s, pool, args.max_gamma, 5, Progress())
    pool.costs = costs
    log(
        f"costs profiled in {time.monotonic() - started:.0f} s: T_target {costs.t_target_ms:.3f} ms, "
        f"C_ver {[round(v, 3) for v in costs.verify_ms]}, step overhead {costs.step_overhead_ms:.3f} ms"
    )
    for d in costs.drafts:
        log(
            f"   {d.name}: T_draft {d.t_draft_ms:.3f} ms/token, α {d.acceptance_rate:.2f}, "
            f"vector {[round(a, 2) for a in d.acceptance_vector]}"
        )
    ceil = ceiling(costs, args.max_gamma, log)

    with tempfile.TemporaryDirectory() as tmp:
        common = dict(
            trials=args.trials,
            max_gamma=args.max_gamma,
            repeats=2,
            finalists=3,
            final_repeats=3,
            storage=f"sqlite:///{tmp}/dynamic.db",
            seed=0,
        )
        static_specs = [x for x in s.specs if x.name in STATIC]
        static = search(s, pool, static_specs, costs, TuneSettings(**common), "static", log)
        dynamic = search(
            s, pool, s.specs, costs, TuneSettings(**common, gamma_policies=POLICIES), "dynamic", log
        )

    if not static or not dynamic:
        raise SystemExit("a search found nothing faster worth re-measuring; rerun with more --trials")
    new = [r for r in dynamic if r.config.draft.kind == "hybrid" or r.config.gamma_policy != "fixed"]
    configs = [static[0].config, dynamic[0].config]
    for extra in (static[1:2], new[:1], dynamic[1:2]):
        for r in extra:
            if all(r.config.key != c.key for c in configs):
                configs.append(r.config)
    entries = [Entry(pool.for_config(c), c.gamma, c.threshold) for c in configs]
    ms = measure_many(s.target.model, entries, s.case, args.check_repeats, seed=1)
    log(
        f"one interleaved run, {args.check_repeats} repeats, {args.prompts} prompts x {args.max_new_tokens} tokens:"
    )
    check = []
    for c, m in zip(configs, ms, strict=True):
        check.append(row(c, m.metrics) | {"mismatches": m.mismatches})
        log(
            f"   {c.label}: {m.metrics.speedup:.3f}x (spread {100 * m.metrics.speedup_spread:.0f}%), "
            f"α {m.metrics.acceptance_rate:.2f}, τ {m.metrics.mean_accepted_len:.2f}, mismatches {m.mismatches}"
            + (f", sources {json.dumps(m.metrics.per_source)}" if m.metrics.per_source else "")
        )
    gain = ms[1].metrics.speedup / ms[0].metrics.speedup
    log(f"tuned with the new kinds / without: {gain:.3f}")

    cats = per_category(args, configs, costs, log)
    log(f"total {time.monotonic() - started:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "costs": {
                    "t_target_ms": costs.t_target_ms,
                    "verify_ms": costs.verify_ms,
                    "step_overhead_ms": costs.step_overhead_ms,
                    "loop_overhead_ms": costs.loop_overhead_ms,
                    "drafts": [d.__dict__ for d in costs.drafts],
                },
                "ceiling": ceil,
                "static_top": [row(r.config, r.metrics) for r in static[:4]],
                "dynamic_top": [row(r.config, r.metrics) for r in dynamic[:4]],
                "interleaved": check,
                "dynamic_over_static": gain,
                "per_category": cats,
            },
            indent=2,
            default=str,
        )
    )
    args.out.with_suffix(".log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
