"""Does the tuner find what an exhaustive grid finds, with a quarter of the trials? And how does
the tuned config compare with transformers' assisted-generation defaults (20 tokens, threshold 0.4)?

1. profile the costs (the cost model seeds the tuner);
2. exhaustive grid over the same space (every draft × γ 1..Γ × thresholds {0, .2, .4, .6}), with
   the final round (top 3 re-measured head to head), as `specdec-tune run --sampler grid` does;
3. TPE with several seeds; each search plus its final round costs ≤ 25 % of the grid's trials
   (the final round is charged in trial-equivalents: timed passes / passes per trial);
4. re-measure the grid winner and every distinct tuned winner in one interleaved run:
   tuned / grid-best per seed (a seed that picked the grid's own winner is 1.0 by identity);
5. our engine with each tuned config vs HF assisted generation at its defaults, interleaved.

    python benchmarks/tuned_vs_grid.py [--prompts 8] [--max-new-tokens 48] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from specdec_tune.backends.native_pool import DrafterPool
from specdec_tune.domain import Config, DraftSpec
from specdec_tune.measure.backends import NativeBackend
from specdec_tune.measure.bench import run_pass
from specdec_tune.measure.costs import measure_costs
from specdec_tune.measure.hfcompare import HFConfig, run_hf_pass
from specdec_tune.measure.timing import median, spread, timed
from specdec_tune.runtime.drafting.build import build_drafter
from specdec_tune.runtime.session import load_models
from specdec_tune.search.space import TuneSettings, grid_size
from specdec_tune.search.tuner import tune


def interleaved(fns: dict, repeats: int) -> dict:
    """tokens/s of each named pass, ABBA-interleaved, after one warm-up each."""
    for fn in fns.values():
        fn()
    rates: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in names if r % 2 == 0 else names[::-1]:
            sec, outs = timed(fns[k], "cpu")
            rates[k].append(sum(map(len, outs)) / sec)
    return rates


def ratio(a: list[float], b: list[float]) -> tuple[float, float]:
    r = [x / y for x, y in zip(a, b, strict=True)]
    return median(r), spread(r)


def top(result, n: int = 6) -> list[str]:
    out = []
    for r in result.results[:n]:
        m = r.metrics
        searched = f", search {m.search_speedup:.3f}" if m.search_speedup is not None else ""
        out.append(f"{r.config.label}: {m.speedup:.3f}{searched}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-gamma", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--finalists", type=int, default=3)
    ap.add_argument("--final-repeats", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--check-repeats", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/tuned_vs_grid.json"))
    args = ap.parse_args()

    s = load_models(
        None, None, "demo-code", args.max_new_tokens, 0.0, "cpu", "auto", args.prompts, lazy_drafts=False
    )
    target = s.target.model
    pool = DrafterPool(s.specs, target, load=lambda spec: s.drafts[spec.name].model)
    drafters = {spec.name: pool.get(spec.name) for spec in s.specs}
    t0 = time.monotonic()
    costs = measure_costs(target, drafters, s.case, "cpu", max_gamma=args.max_gamma, repeats=5)
    profile_s = time.monotonic() - t0
    db = Path(tempfile.mkdtemp()) / "bench.db"
    base = dict(
        max_gamma=args.max_gamma,
        repeats=args.repeats,
        finalists=args.finalists,
        final_repeats=args.final_repeats,
        storage=f"sqlite:///{db}",
    )
    n_grid = grid_size(s.specs, TuneSettings(**base))
    # A trial times `repeats` baseline + `repeats` speculative passes; the final round times
    # (finalists + 1) passes per repeat. Charge the final round in those trial-equivalents.
    final_equiv = math.ceil((args.finalists + 1) * args.final_repeats / (2 * args.repeats))
    budget = math.floor(0.25 * n_grid) - final_equiv
    out: dict = {
        "grid_trials": n_grid,
        "tpe_trials": budget,
        "final_round_trial_equivalents": final_equiv,
        "tpe_share_of_grid": round((budget + final_equiv) / n_grid, 4),
        "profile_s": round(profile_s, 1),
    }
    print(json.dumps(out), flush=True)

    t0 = time.monotonic()
    grid = tune(
        NativeBackend(pool),
        s.specs,
        s.case,
        TuneSettings(trials=n_grid, sampler="grid", study_name="grid", **base),
        costs,
    )
    out["grid_s"] = round(time.monotonic() - t0, 1)
    out["grid_top"] = top(grid)
    print(json.dumps(out), flush=True)
    tuned = {}
    for seed in args.seeds:
        t0 = time.monotonic()
        res = tune(
            NativeBackend(pool),
            s.specs,
            s.case,
            TuneSettings(trials=budget, sampler="tpe", seed=seed, study_name=f"tpe-{seed}", **base),
            costs,
        )
        tuned[seed] = res
        out[f"tpe_{seed}"] = {
            "s": round(time.monotonic() - t0, 1),
            "top": top(res),
            "trials": [
                f"{r['draft']} g{r['gamma']} t{r['threshold']}: {r['state']} "
                + (f"{r['speedup']:.3f}" if r["speedup"] is not None else "")
                for r in res.rows
            ],
        }
        print(json.dumps(out[f"tpe_{seed}"]), flush=True)

    def runner(cfg):
        d = build_drafter(cfg.draft, target, s.draft_modules) if cfg.gamma else None
        return lambda: run_pass(target, d, cfg.gamma, cfg.threshold, s.case)[0]

    gb = grid.results[0].config
    distinct = {gb.label: gb}
    for res in tuned.values():
        distinct.setdefault(res.results[0].config.label, res.results[0].config)
    plain = Config(DraftSpec("none", "none"), 0)
    rates = interleaved(
        {"base": runner(plain), **{k: runner(c) for k, c in distinct.items()}}, args.check_repeats
    )
    check: dict = {"grid_best": gb.label}
    for label in distinct:
        check[f"{label} vs base"] = ratio(rates[label], rates["base"])
    for seed, res in tuned.items():
        label = res.results[0].config.label
        if label == gb.label:
            check[f"seed {seed}: {label} / grid"] = [1.0, 0.0, "same config as the grid's winner"]
        else:
            check[f"seed {seed}: {label} / grid"] = list(ratio(rates[label], rates[gb.label]))
    out["remeasured"] = check
    print(json.dumps(check), flush=True)

    # HF defaults: the grid's best model draft (or draft-1l), 20 tokens, threshold 0.4.
    model_drafts = [r.config.draft.name for r in grid.results if r.config.draft.kind == "model"]
    hf_draft = model_drafts[0] if model_drafts else "draft-1l"
    hf_fn = lambda: run_hf_pass(target, s.case, HFConfig("model", 20, 0.4, s.drafts[hf_draft].model))  # noqa: E731
    tuned_labels = list(dict.fromkeys(res.results[0].config.label for res in tuned.values()))
    rates = interleaved(
        {"hf_defaults": hf_fn, **{k: runner(distinct[k]) for k in tuned_labels}}, args.check_repeats
    )
    out["vs_hf_defaults"] = {"hf_draft": hf_draft, "hf_tok_s": median(rates["hf_defaults"])}
    for k in tuned_labels:
        out["vs_hf_defaults"][k] = list(ratio(rates[k], rates["hf_defaults"]))
    print(json.dumps(out, indent=2), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
