"""Batched serving on the demo pair: throughput scaling, speedup(B), γ*(B), B* measured and predicted.

For each batch size B (closed loop: B requests in flight, a finished one replaced by the next
prompt), every config below and plain batched decoding are timed in ONE interleaved run
(`measure_batched_many`). Also: the batched engine at B = 1 against the batch-1 engine, and the
cost model's predictions from the cost surface beside the measurements.

    python benchmarks/batched.py            # ~5 min on a 2-core CPU
    python benchmarks/batched.py --batch-sizes 1,16   # the cost model's error at B = 1 and 16
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from specdec_tune.measure.batched import BatchEntry, measure_batched_many
from specdec_tune.measure.bench import run_pass
from specdec_tune.measure.costs import measure_costs
from specdec_tune.measure.surface import measure_surface
from specdec_tune.measure.timing import interleaved, median, spread
from specdec_tune.runtime.batch import batch_generate
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.session import load_models
from specdec_tune.runtime.workloads import Case
from specdec_tune.search.costmodel import CostModel

CONFIGS = [("draft-1l", g) for g in (1, 2, 3, 4, 6)] + [("draft-2l", 3), ("prompt-lookup", 3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--engine", default="eager", help="engine mode (runtime.caches.modes): eager, static, compiled, auto"
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/batched.json"))
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]

    s = load_models(
        None, ["draft-1l", "draft-2l", "prompt-lookup"], "demo-code", args.max_new_tokens, 0.0, "cpu", "auto",
        lazy_drafts=False,
        engine_mode=args.engine,
    )  # fmt: skip
    target = s.target.model
    # The workload's prompts, repeated until there are enough requests to refill every slot.
    prompts = (s.case.prompts * (args.requests // len(s.case.prompts) + 1))[: args.requests]
    case = Case(prompts, [args.max_new_tokens] * len(prompts), s.case.eos, 0.0)
    specs = {spec.name: spec for spec in s.specs}
    out: dict = {
        "machine": platform.processor() or platform.machine(),
        "args": vars(args) | {"out": str(args.out)},
    }

    # 1. The batched engine at B = 1 against the batch-1 engine (plain and draft-1l γ4).
    one = case.head(8)
    d1 = build_drafter(specs["draft-1l"], target, s.draft_modules)
    b1 = build_drafter(specs["draft-1l"], target, s.draft_modules, rows=1)
    runs = {
        "engine plain": lambda r: run_pass(target, None, 0, 0.0, one)[0],
        "batched plain": lambda r: batch_generate(target, None, one, 1, 0).outputs,
        "engine draft-1l γ4": lambda r: run_pass(target, d1, 4, 0.0, one)[0],
        "batched draft-1l γ4": lambda r: batch_generate(target, b1, one, 1, 4).outputs,
    }
    for fn in runs.values():
        fn(0)
    timed = interleaved(runs, 5, "cpu")
    rates = {k: [sum(map(len, o)) / sec for sec, o in v] for k, v in timed.items()}
    out["b1"] = {k: round(median(v), 1) for k, v in rates.items()}
    for kind in ("plain", "draft-1l γ4"):
        ratios = [a / b for a, b in zip(rates[f"batched {kind}"], rates[f"engine {kind}"], strict=True)]
        out["b1"][f"batched/engine {kind}"] = round(median(ratios), 3)
        out["b1"][f"spread {kind}"] = round(spread(ratios), 3)
    print(json.dumps(out["b1"]), flush=True)

    # 2. The cost surface and the cost model's predictions.
    t0 = time.monotonic()
    drafters = {n: build_drafter(spec, target, s.draft_modules) for n, spec in specs.items()}
    costs = measure_costs(target, drafters, s.case.head(8), "cpu", max_gamma=6, repeats=5)
    makers = {
        n: (lambda b, spec=spec: build_drafter(spec, target, s.draft_modules, rows=b))
        for n, spec in specs.items()
    }
    costs.batch, costs.memory_bound_until = measure_surface(
        target, makers, sizes, costs.context_len, 6, repeats=3, case=s.case.head(8)
    )
    # The cost model knows the requests' budgets (the budget cut, search.loopterms).
    model = CostModel(costs, budgets=case.max_new_tokens)
    out["surface"] = {
        b.batch_size: {
            "t_target_ms": round(b.t_target_ms, 3),
            "verify_over_t_target": [round(v / b.t_target_ms, 3) for v in b.verify_ms],
            "t_draft_ms": {k: round(v, 3) for k, v in b.t_draft_ms.items()},
        }
        for b in costs.batch
    }
    out["memory_bound_until"] = costs.memory_bound_until
    out["predicted_b_star"] = model.b_star(6)
    out["profile_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps({"surface": out["surface"], "predicted_b_star": out["predicted_b_star"]}), flush=True)

    # 3. Every config and plain decoding at each batch size, interleaved.
    rows = []
    for b in sizes:
        t0 = time.monotonic()
        entries = [
            BatchEntry(lambda n=n, b=b: build_drafter(specs[n], target, s.draft_modules, rows=b), g)
            for n, g in CONFIGS
        ]
        ms = measure_batched_many(target, entries, case, b, args.repeats)
        row = {
            "batch_size": b,
            "plain_tok_s": round(ms[0].plain.tokens_per_s, 1),
            "plain_latency_ms_p50": round(ms[0].plain.latency_ms_p50, 1),
            "plain_latency_ms_p90": round(ms[0].plain.latency_ms_p90, 1),
            "plain_peak_mb": ms[0].plain.peak_memory_mb,
            "configs": [
                {
                    "draft": n,
                    "gamma": g,
                    "speedup": round(m.metrics.speedup, 3),
                    "spread": round(m.metrics.speedup_spread, 3),
                    "tok_s": round(m.metrics.tokens_per_s, 1),
                    "alpha": round(m.metrics.acceptance_rate, 3),
                    "latency_ms_p50": round(m.speculative.latency_ms_p50, 1),
                    "latency_ms_p90": round(m.speculative.latency_ms_p90, 1),
                    "peak_mb": m.speculative.peak_memory_mb,
                    "mismatches": m.mismatches,
                    "predicted": model.predict(n, g, b),
                }
                for (n, g), m in zip(CONFIGS, ms, strict=True)
            ],
            "seconds": round(time.monotonic() - t0, 1),
        }
        best = max(row["configs"], key=lambda c: c["speedup"])
        row["best"] = best if best["speedup"] > 1.0 else {"draft": "none", "gamma": 0, "speedup": 1.0}
        rows.append(row)
        print(
            json.dumps({k: v for k, v in row.items() if k != "configs"} | {"best": row["best"]}), flush=True
        )
    out["rows"] = rows

    # 4. Plain batched decoding at every batch size in ONE interleaved run: the scaling.
    plain_runs = {b: (lambda r, b=b: batch_generate(target, None, case, b, 0)) for b in sizes}
    scaling = interleaved(plain_runs, 3, "cpu")
    # Steady state: tokens/s while all B slots were busy (as measure_batched_many reports it).
    plain_rates = {b: median([run.steady_tokens_per_s for _, run in v]) for b, v in scaling.items()}
    out["plain_tok_s_interleaved"] = {b: round(v, 1) for b, v in plain_rates.items()}
    out["plain_scaling"] = {b: round(v / plain_rates[sizes[0]], 2) for b, v in plain_rates.items()}
    losing = [r["batch_size"] for r in rows if r["best"]["gamma"] == 0]
    out["measured_b_star"] = min(losing) if losing else None
    # Following γ*(B) (and no speculation from B* on) against the best single fixed config.
    follow = statistics.mean(r["best"]["speedup"] for r in rows)
    fixed = {
        f"{n} γ{g}": statistics.mean(r["configs"][i]["speedup"] for r in rows)
        for i, (n, g) in enumerate(CONFIGS)
    }
    best_fixed = max(fixed, key=fixed.get)
    out["follow_gamma_star"] = {
        "mean_speedup_following": round(follow, 3),
        "best_fixed": best_fixed,
        "mean_speedup_best_fixed": round(fixed[best_fixed], 3),
        "gain": round(follow / fixed[best_fixed] - 1, 3),
    }
    # The cost model against the measurements: top 6 configs at B = 1 and at the largest B.
    errors = {}
    for r in (rows[0], rows[-1]):
        top = sorted(r["configs"], key=lambda c: -c["speedup"])[:6]
        errs = [abs(c["predicted"] - c["speedup"]) / c["speedup"] for c in top if c["predicted"]]
        errors[r["batch_size"]] = round(statistics.median(errs), 3) if errs else None
    out["cost_model_median_rel_error"] = errors
    print(
        json.dumps(
            {
                k: out[k]
                for k in (
                    "plain_scaling",
                    "measured_b_star",
                    "predicted_b_star",
                    "follow_gamma_star",
                    "cost_model_median_rel_error",
                )
            }
        ),
        flush=True,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
