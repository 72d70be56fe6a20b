"""Does the tuner find what an exhaustive grid finds, with a quarter of the trials? And how does
the tuned config compare with transformers' assisted-generation defaults (20 tokens, threshold 0.4)?

1. profile the costs (the cost model seeds the tuner);
2. exhaustive grid over the same space (every draft × γ 1..Γ × thresholds {0, .2, .4, .6});
3. TPE with ≤ 25% of the grid's trials;
4. re-measure the tuned best and the grid best in one interleaved run: tuned / grid-best;
5. our engine with the tuned config vs HF assisted generation with its defaults, interleaved.

    python benchmarks/tuned_vs_grid.py [--prompts 8] [--max-new-tokens 48] [--max-gamma 8]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from specdec_tune.drafters import build_drafter
from specdec_tune.hfcompare import run_hf_pass
from specdec_tune.measure import Case, run_pass
from specdec_tune.profile import Config, DraftSpec
from specdec_tune.profiler import profile_costs
from specdec_tune.session import open_session
from specdec_tune.timing import median, spread, timed
from specdec_tune.tuner import DrafterPool, TuneSettings, grid_size, tune


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-gamma", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--final-repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/tuned_vs_grid.json"))
    args = ap.parse_args()

    s = open_session(None, None, "demo-code", args.max_new_tokens, 0.0, "cpu", "auto", args.prompts)
    target = s.target.model
    pool = DrafterPool(s.specs, target, load=lambda spec: s.drafts[spec.name].model)
    drafters = {spec.name: pool.get(spec.name) for spec in s.specs}
    t0 = time.monotonic()
    sub = Case(s.case.prompts, s.case.max_new_tokens, s.case.eos, 0.0)
    costs = profile_costs(target, drafters, sub, "cpu", max_gamma=args.max_gamma, repeats=5)
    profile_s = time.monotonic() - t0
    db = Path(tempfile.mkdtemp()) / "bench.db"
    base = dict(seed=0, max_gamma=args.max_gamma, repeats=args.repeats, storage=f"sqlite:///{db}")
    n_grid = grid_size(s.specs, TuneSettings(**base))
    budget = math.floor(0.25 * n_grid)
    out = {"grid_trials": n_grid, "tpe_trials": budget, "profile_s": round(profile_s, 1)}
    print(json.dumps(out), flush=True)

    t0 = time.monotonic()
    grid = tune(
        target,
        s.specs,
        s.case,
        TuneSettings(trials=n_grid, sampler="grid", study_name="grid", **base),
        costs,
        pool,
    )
    out["grid_s"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    tpe = tune(
        target,
        s.specs,
        s.case,
        TuneSettings(trials=budget, sampler="tpe", study_name="tpe", **base),
        costs,
        pool,
    )
    out["tpe_s"] = round(time.monotonic() - t0, 1)
    gb, tb = grid.results[0], tpe.results[0]
    out["grid_best"] = {"config": gb.config.label, "speedup_in_search": gb.metrics.speedup}
    out["tuned_best"] = {"config": tb.config.label, "speedup_in_search": tb.metrics.speedup}
    print(json.dumps(out), flush=True)

    def runner(cfg):
        d = build_drafter(cfg.draft, target, s.draft_modules) if cfg.gamma else None
        return lambda: run_pass(target, d, cfg.gamma, cfg.threshold, s.case)[0]

    plain = Config(DraftSpec("none", "none"), 0)
    rates = interleaved(
        {"base": runner(plain), "tuned": runner(tb.config), "grid": runner(gb.config)}, args.final_repeats
    )
    ratio = [t / g for t, g in zip(rates["tuned"], rates["grid"], strict=True)]
    out["remeasured"] = {
        "tuned_speedup": median([t / b for t, b in zip(rates["tuned"], rates["base"], strict=True)]),
        "grid_speedup": median([g / b for g, b in zip(rates["grid"], rates["base"], strict=True)]),
        "tuned_over_grid": median(ratio),
        "spread": spread(ratio),
    }
    print(json.dumps(out), flush=True)

    # HF defaults: the best model draft the grid found (or draft-1l), 20 tokens, threshold 0.4.
    model_drafts = [r.config.draft.name for r in grid.results if r.config.draft.kind == "model"]
    hf_draft = model_drafts[0] if model_drafts else "draft-1l"
    hf_fn = lambda: run_hf_pass(target, s.case, "model", 20, 0.4, s.drafts[hf_draft].model)  # noqa: E731
    rates = interleaved({"tuned": runner(tb.config), "hf_defaults": hf_fn}, args.final_repeats)
    r = [t / h for t, h in zip(rates["tuned"], rates["hf_defaults"], strict=True)]
    out["vs_hf_defaults"] = {
        "hf_draft": hf_draft,
        "tuned_tok_s": median(rates["tuned"]),
        "hf_tok_s": median(rates["hf_defaults"]),
        "ratio": median(r),
        "spread": spread(r),
    }
    print(json.dumps(out, indent=2), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
